"""Saved vs recomputed (`profile.stored`, what the generator follows), by a policy:
- "recompute" (the default): nothing stored; the backward recomputes every intermediate from the
  inputs. The forward writes only its outputs (fastest forward, least memory).
- "min-bytes": store the forward intermediates that make the backward read fewer bytes — one
  that lets it drop an input it needed only to recompute that intermediate, when smaller than
  that input (LeakyReLU's bool mask, 1 B, instead of x, 2 B in bf16). Bytes are counted at the
  traced shapes in bf16 (the dtype the benchmarks run in); the forward pays one extra write.
"""

from __future__ import annotations

import itertools

from kernelwright.profiles.kernel import GraphNode, KernelProfile, StoredTensor
from kernelwright.workflows.create.graph import REDUCTIONS, TRANSCENDENTAL, _calls, _op
from kernelwright.workflows.create.understand import _main_index

SAVE_POLICIES = ("recompute", "min-bytes")
# bytes per element, at bf16: an input or a "same" stored value 2, fp32 4, bool 1, int64 8
_BYTES = {"bool": 1, "same": 2, "fp32": 4, "int": 8}
# more candidates than this: only the first ones (forward order) are tried, 2^8 subsets at most
_MAX_CANDIDATES = 8


def _numel(shape: list[int] | None) -> int:
    out = 1
    for d in shape or []:
        out *= d
    return out


def stored_dtype(node: GraphNode, full: list[int]) -> str:
    """The dtype an intermediate is stored in: bool for comparisons and masks; fp32 for
    precision-sensitive values (a transcendental or reduction, or a row statistic: smaller
    than the main input, so fp32 costs little); else the input's dtype."""
    if node.dtype == "torch.bool":
        return "bool"
    op = _op(node)
    if op in TRANSCENDENTAL or op in REDUCTIONS or _numel(node.shape) < _numel(full):
        return "fp32"
    return "same"


def plan_stored(profile: KernelProfile, policy: str) -> KernelProfile:
    """Set `profile.save_policy` and `profile.stored` by the policy (see the module doc).

    min-bytes tries every subset of the candidates — forward intermediates the traced backward
    reads or recomputes — and keeps the one whose backward reads the fewest bytes (inputs it
    still needs plus the stored values), ties to fewer stored; the generator's own analysis
    says which inputs each choice leaves the backward needing.
    """
    from kernelwright.workflows.create.emit import UnsupportedNode, _Emitter

    if policy not in SAVE_POLICIES:
        raise ValueError(f"save policy must be one of {SAVE_POLICIES}, got {policy!r}")
    profile.save_policy = policy
    profile.stored = []
    if policy == "recompute" or profile.tier == 3:
        return profile
    fwd = {n.name: n for n in _calls(profile.forward)}
    bwd_names = {n.name for n in profile.backward.nodes if n.op != "output"}
    candidates = [n for n in fwd if n in bwd_names][:_MAX_CANDIDATES]
    main = profile.inputs[_main_index(profile.inputs)].example_shape
    in_bytes = [_numel(s.example_shape) * _BYTES["int" if s.dtype == "int" else "same"]
                for s in profile.inputs]  # fmt: skip

    def choice(names) -> list[StoredTensor]:
        return [StoredTensor(name=n, dtype=stored_dtype(fwd[n], main)) for n in names]

    def cost(names) -> tuple[int, set[int]] | None:
        """Bytes the backward reads with `names` stored, and the inputs it reads; None when the
        generator cannot store them (shape) or the backward would not read one of them."""
        trial = profile.model_copy(update={"stored": choice(names)})
        try:
            em = _Emitter(trial)
            em.stored_kinds()
            needed = em.backward_body()[3]
        except UnsupportedNode:
            return None
        stored = sum(_numel(fwd[t.name].shape) * _BYTES[t.dtype] for t in trial.stored)
        return sum(in_bytes[i] for i in needed) + stored, needed

    base = cost(())
    if base is None:
        profile.notes.append(
            "save policy min-bytes: the backward cannot be generated; nothing stored"
        )
        return profile
    best, best_cost = (), base
    for k in range(1, len(candidates) + 1):
        for names in itertools.combinations(candidates, k):
            c = cost(names)
            if c is not None and c[0] < best_cost[0]:
                best, best_cost = names, c
    stored = choice(best)
    for t in stored:
        without = cost(tuple(n for n in best if n != t.name))
        dropped = sorted((without[1] if without else base[1]) - best_cost[1])
        drops = ", ".join(f"{profile.inputs[i].name} ({in_bytes[i]} B)" for i in dropped)
        t.reason = (
            f"min-bytes: as {t.dtype} ({_BYTES[t.dtype]} B/element, "
            f"{_numel(fwd[t.name].shape) * _BYTES[t.dtype]} B at the traced shape) it lets the "
            f"backward drop {drops or 'no input alone'}: the backward reads {best_cost[0]} B of "
            f"saved tensors instead of {base[0]} B (bf16 inputs)"
        )
    profile.stored = stored
    return profile
