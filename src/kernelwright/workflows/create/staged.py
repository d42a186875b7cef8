"""Looped row kernels: rows longer than one program holds in registers, and reductions over
every dim (a loss returning a scalar is one row of every element).

The row is cut into chunks on separate programs, so a single long row still fills the GPU. The
reductions are ordered by level: one whose input needs no other reduction is level 1, one that
needs a level-1 value is level 2 (softmax: amax, then the sum of exp(x - max)). Each level is
one launch of a partial kernel (a sum of exp(x - max) joins its max's launch, kept relative to
the running max: `_online`): every program walks its chunk in BLOCK_N tiles, recomputing the
element-wise work from the inputs, and writes one fp32 partial per reduction; a merge kernel
(one launch a level) combines each row's partials in a fixed order (sum, max or min over the
chunk axis, then the mean's division), so the result does not depend on scheduling.
var_mean takes one pass: each tile's mean and centered sum of squares (the tile held in
registers, so no cancellation) merge into the chunk's, and the chunks' into the row's (in fp64),
by Chan's pairwise update. A scan (cumsum) stores each tile's total; the launcher turns the
totals into each tile's carry (an exclusive prefix, or suffix for a flipped row) and every later
kernel scans its tile and adds the carry; a cumprod the same with products (the carry from the
totals shifted by one tile, no division, so a zero stays exact). A prod's partials are the
chunks' products. An argmax/argmin keeps each chunk's extreme and the column where it first
occurs; the merge takes the first chunk at the row's extreme (torch's tie rule). A gather by a
per-row index input, alone at its level, reads each row's element at its index column only (the
chunk that holds the column adds it; cross-entropy's log-probability of the target after the
logsumexp's pass, not a second walk of the row). The last launch computes the outputs (or
gradients) tile by tile from the inputs and the row values. A row of another dim than the last
(an [A, N, B] view) is walked the same way in tiles of B-neighbours (templates/slab.py.j2 picks
the tile: runs of up to 1024 neighbours, read as one stretch of memory).

This module turns the emitter's node lowering into the line lists of those kernels; the
template assembles them (templates/staged.py.j2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelwright.profiles.kernel import GraphNode
from kernelwright.workflows.create.lowering import _NEUTRAL, _SCANS, UnsupportedNode, _refs

# the combine op of each reduction target, by aten name (var_mean is split in two slots)
_COMBINE = {"aten.sum": "sum", "aten.mean": "sum", "aten.amax": "max", "aten.amin": "min",
            "aten.prod": "prod"}  # fmt: skip


# the row values a forward's looped launch can hand to the backward: plain combines, a
# var_mean's mean and variance, an argmax/argmin's column (a scan's carries are not kept)
_GIVEN = ("sum", "max", "min", "prod", "argmax", "argmin", "wmean", "wm2")


def _reduce(op: str, tile: str) -> str:
    """A [ROWS, 1] reduction of a tile along the row (`_mul`: the module's product combine)."""
    if op == "prod":
        return f"tl.reduce({tile}, 1, _mul)[:, None]"
    return f"tl.{op}({tile}, axis=1)[:, None]"


@dataclass
class Slot:
    """One row value: a reduction (or half of a var_mean) held as fp32 per row."""

    var: str  # its name in kernel code (f_amax, f_var_mean_1, ...)
    op: str  # how partials combine: "sum", "max" or "min"
    arg: str  # the reduced tile's expression
    post: str  # applied after merging the chunks: "", " / n" or " / (n - c)"
    level: int
    reverse: bool = False  # a scan from the row's end (cumsum of a flipped row)
    scan: int = -1  # a scan's index among the scans: its tile totals, then carries
    target: str = ""  # a scan's aten target (cumsum, cumprod): how tiles and carries combine
    # a gather by a per-row index input: (the input's position, the lines computing the column
    # from it, the column's var or "" for the input itself, the gathered value's var)
    pick: tuple[int, list[str], str, str] | None = None


@dataclass
class Stage:
    level: int
    slots: list[int]  # the slots this launch computes (indices into Plan.slots)
    lines: list[str] = field(default_factory=list)  # the tile loop's body, then accumulation
    # online sums (slot indices) folded into the stage of the max they are shifted by: each
    # keeps one more partial, the shift its sum is relative to
    shifts: list[int] = field(default_factory=list)
    online_max: int = -1  # that max's slot index
    # a stage of one gather read at its column alone (`Slot.pick`): no loop over the chunk
    pick: tuple[int, list[str], str] | None = None


@dataclass
class Plan:
    slots: list[Slot]
    stages: list[Stage]
    final: list[str]  # the output kernel's body: every row value is loaded
    # (slot, the forward's slot) of the row values copied from the forward's kept ones
    given: list[tuple[int, int]] = field(default_factory=list)


class _Item:
    def __init__(self, node: GraphNode, group: int, var: str, deps: list[str]):
        self.node, self.group, self.var, self.deps = node, group, var, deps


def plan(
    em,
    groups: list[tuple[list[GraphNode], str, dict[str, str]]],
    roots: list[str],
    given: dict[str, int] | None = None,
) -> Plan:
    """The staged kernels for the node groups (nodes, prefix, alias) the one-tile kernel emits
    in that order; `roots`: the code names the last kernel needs (outputs or gradients).

    `given`: row values the forward's looped launch keeps ({var: its slot there}); a backward
    reduction all of whose slots are given is copied from there instead of recomputed (no
    pass over the inputs for it)."""
    items: list[_Item] = []
    for g, (nodes, prefix, alias) in enumerate(groups):
        names = {n.name for n in nodes} | set(alias)
        for n in nodes:
            if n.op != "call_function":
                continue
            refs = _refs(list(n.args), names) + _refs(list(n.kwargs.values()), names)
            items.append(_Item(n, g, prefix + n.name, [alias.get(r, prefix + r) for r in refs]))
    by_var = {it.var: it for it in items}
    # which values are flipped rows, and their unflipped code: the emitter's own account
    em.flipped = {}
    for nodes, prefix, alias in groups:
        em.emit(nodes, prefix, alias)
    flips = dict(em.flipped)
    level: dict[str, int] = {}
    slots: list[Slot] = []
    owned: dict[str, list[int]] = {}  # reduction var -> its slots

    def add_reduction(it: _Item, base: int) -> None:
        """The slots of a reduction along the row (its level: one above its inputs')."""
        n = it.node
        arg = it.deps[0] if it.deps else None
        if arg is None:
            raise UnsupportedNode(n.name, "a reduction of a constant")
        # a flipped row is reduced unflipped (the emitter refuses order-dependent ones)
        reverse, arg = arg in flips, flips.get(arg, arg)
        aten = n.target.rsplit(".", 1)[0]
        if n.target in _SCANS:
            # per tile of the row: its total, then (launcher) the exclusive prefix of the
            # totals before it — or after it, for a flipped row — added to the tile's scan
            u = arg
            owned[it.var] = [len(slots)]
            n_scans = sum(1 for s in slots if s.op == "scan")
            slots.append(Slot(it.var, "scan", u, "", base + 1, reverse, n_scans, n.target))
            level[it.var] = base + 1
            return
        if aten in ("aten.max", "aten.min", "aten.argmax", "aten.argmin"):
            # the index of the first extreme value: each chunk keeps its extreme and the
            # column where it first occurs; the merge kernel takes the first chunk's at the
            # row's extreme (max/min also keep the value, as a plain slot)
            op = "max" if aten in ("aten.max", "aten.argmax") else "min"
            paired = aten in ("aten.max", "aten.min")
            index_var = f"{it.var}_1" if paired else it.var
            owned[it.var] = [len(slots)] + ([len(slots) + 1] if paired else [])
            slots.append(Slot(index_var, "arg" + op, arg, "", base + 1))
            if paired:
                slots.append(Slot(f"{it.var}_0", op, arg, "", base + 1))
            level[it.var] = base + 1
            return
        if aten == "aten.gather":
            owned[it.var] = [len(slots)]
            pick = f"tl.where(cols == {it.deps[1]}, {arg}, 0.0)"
            at = _pick_index(em, it, groups) if em.trailing else None
            slots.append(Slot(it.var, "sum", pick, "", base + 1, pick=at and (*at, arg)))
            level[it.var] = base + 1
            return
        if aten in ("aten.var_mean", "aten.var"):
            # one pass: each tile's mean and centered sum of squares (two passes over the tile
            # in registers: no cancellation), merged into the chunk's by Chan's update; the
            # launcher merges the chunks' the same way (`wmean` then `wm2`, adjacent slots)
            corr = n.kwargs.get("correction", 1)
            corr = 1 if corr is None else corr
            mean = Slot(f"{it.var}_1", "wmean", arg, "", base + 1)
            name = it.var if aten == "aten.var" else f"{it.var}_0"
            var = Slot(name, "wm2", arg, f" / (n - {float(corr)!r})", base + 1)
            owned[it.var] = [len(slots), len(slots) + 1]
            slots.extend([mean, var])
            level[mean.var], level[var.var] = mean.level, var.level
            level[it.var] = var.level
            return
        post = " / n" if aten == "aten.mean" else ""
        owned[it.var] = [len(slots)]
        slots.append(Slot(it.var, _COMBINE[aten], arg, post, base + 1))
        level[it.var] = base + 1
        return

    for it in items:
        n = it.node
        base = max((level.get(d, 0) for d in it.deps), default=0)
        if em.reduce_kind(n) == "row":
            add_reduction(it, base)
            if given and all(slots[j].var in given and slots[j].op in _GIVEN
                             for j in owned[it.var]):  # fmt: skip
                # computed by the forward: a row value before any stage
                for j in owned[it.var]:
                    slots[j].level = level[slots[j].var] = 0
                level[it.var] = 0
            continue
        if n.target == "getitem" and it.deps:
            level[it.var] = level.get(f"{it.deps[0]}_{int(n.args[1])}", base)
            continue
        level[it.var] = base

    def needed(start: list[str], k: int | None) -> set[str]:
        """Vars to emit for `start`: reductions are loaded (slots below level k), and walked
        through only when they own a slot of level k."""
        need: set[str] = set()
        stack = list(start)
        while stack:
            v = stack.pop()
            it = by_var.get(v)
            if it is None or v in need:
                continue
            need.add(v)
            if it.var in owned:
                mine = k is not None and any(slots[j].level == k for j in owned[it.var])
                if mine or any(slots[j].op == "scan" for j in owned[it.var]):
                    stack.extend(it.deps)  # a scan's tile is scanned again where it is read
                continue
            stack.extend(it.deps)
        return need

    def body(need: set[str], k: int | None, extra: dict[str, list[str]] | None = None) -> list[str]:
        loads: dict[str, list[str]] = {}
        carry: dict[str, str] = {}
        for var, js in owned.items():
            ready = [j for j in js if k is None or slots[j].level < k]
            loads[var] = [
                f"{slots[j].var} = tl.load(red_ptr + {j} * M + rows, mask=rmask, other=0.0)"
                for j in ready if slots[j].op != "scan"
            ]  # fmt: skip
            for j in ready:
                s = slots[j]
                if s.op == "scan":
                    carry[var] = (
                        f"tl.load(scan_ptr + ({s.scan} * M + rows) * TILES + tile, mask=rmask, "
                        "other=0.0)"
                    )
                    if not s.reverse:
                        fn, join, pad = _SCANS[s.target]
                        loads[var] = [
                            f"{var} = {fn}(tl.where(cmask, {s.arg}, {pad}), axis=1) {join} "
                            f"{carry[var]}"
                        ]
        loads.update(extra or {})
        lines: list[str] = []
        em.loads, em.carry, em.flipped = loads, carry, {}
        try:
            for nodes, prefix, alias in groups:
                chosen = [n for n in nodes
                          if n.op == "placeholder" or prefix + n.name in need]  # fmt: skip
                lines += em.emit(chosen, prefix, alias)
        finally:
            em.loads, em.carry = None, {}
        return lines

    depth = max((s.level for s in slots), default=0)
    online = _online(slots, owned, by_var)
    stages = []
    for k in range(1, depth + 1):
        mine = [j for j, s in enumerate(slots) if s.level == k]
        if stages and stages[-1].shifts and all(slots[j].level == k for j in stages[-1].shifts):
            continue  # folded into the stage of their max
        start = [v for j in mine for v in (by_var[_owner(slots[j].var, owned)].var,)]
        nxt = [j for j, s in enumerate(slots) if s.level == k + 1]
        jm = online.get(nxt[0], (-1, ""))[0] if nxt else -1
        scans = any(slots[j].op == "scan" for j in mine)
        if jm in mine and not scans and all(online.get(j, (-1, ""))[0] == jm for j in nxt):
            stages.append(_online_stage(k, mine, nxt, jm, online, slots, owned, by_var, needed,
                                        body))  # fmt: skip
            continue
        lines = body(needed(start, k), k)
        s0 = slots[mine[0]]
        if (
            len(mine) == 1
            and s0.pick
            and not any(w in "\n".join(lines) for w in ("cmask", "tile", "cols"))
        ):
            # the gather alone at its level: its value at the row's index column, read there
            # (each chunk adds it where the column falls in the chunk: the row's sum is that one
            # value, or 0 for an index outside the row, as the masked sum)
            lines.append(f"acc0 += tl.where(mask, {s0.pick[3]}, 0.0)")
            stages.append(Stage(k, mine, lines, pick=s0.pick[:3]))
            continue
        for j in mine:
            s = slots[j]
            if s.op == "scan":  # the tile's total (or product), for the launcher's carries
                op = "prod" if s.target == "aten.cumprod.default" else "sum"
                total = (f"tl.where(mask, {s.arg} + tl.zeros([ROWS, BLOCK_N], tl.float32), "
                         f"{_NEUTRAL[op]})")  # fmt: skip
                lines.append(
                    f"tl.store(scan_ptr + ({s.scan} * M + rows) * TILES + tile, "
                    f"{_reduce(op, total)}, mask=rmask)"
                )
        accs = [j for j in mine if slots[j].op != "scan"]
        wmeans = [j for j in accs if slots[j].op == "wmean"]  # each keeps a shift after the rest
        for t, j in enumerate(accs):
            k_at = len(accs) + wmeans.index(j) if j in wmeans else -1
            lines += _accumulate(slots[j], t, k_at)
        stages.append(Stage(k, mine, lines))
    final = body(needed(roots, None), None)
    kept = [(j, given[s.var]) for j, s in enumerate(slots) if s.level == 0 and given]
    return Plan(slots, stages, final, kept)


def _pick_index(em, it: _Item, groups) -> tuple[int, list[str], str] | None:
    """The forward's gather by a per-row int index input: `pick.index_input` of its index;
    None for the backward's groups (the masked row sum)."""
    from kernelwright.workflows.create.pick import index_input

    if it.group != 0 or groups[0][1] != "f_" or groups[0][2]:
        return None
    return index_input(em, it.node.args[2])


def _online(
    slots: list[Slot], owned: dict[str, list[int]], by_var: dict
) -> dict[int, tuple[int, str]]:
    """The sums that can run in one pass with the max they are shifted by (softmax's and
    logsumexp's sum of exp(x - max)): {sum slot: (max slot, the shift's var)}.

    A sum of exp(X - S) where X needs no value of the max's level or above and S is a per-row
    value of the max alone (the max itself, or logsumexp's max with infinities replaced by 0)
    can be kept relative to the running max: when the max grows from m to m', S(m) becomes
    S(m') and the sum so far is scaled by exp(S(m) - S(m'))."""
    out: dict[int, tuple[int, str]] = {}

    def leaves(var: str, seen: set[str]) -> set[str]:
        # the reductions and inputs a value is computed from
        if var in seen:
            return set()
        seen.add(var)
        it = by_var.get(var)
        if it is None or var in owned:
            return {var}
        found: set[str] = set()
        for d in it.deps:
            found |= leaves(d, seen)
        return found

    for j, s in enumerate(slots):
        e = by_var.get(s.arg)
        if s.op != "sum" or e is None or e.node.target != "aten.exp.default" or len(e.deps) != 1:
            continue
        sub = by_var.get(e.deps[0])
        if sub is None or sub.node.target != "aten.sub.Tensor" or sub.node.kwargs:
            continue
        if len(sub.deps) != 2 or not all(isinstance(a, str) for a in sub.node.args[:2]):
            continue
        x, shift = sub.deps
        maxes = leaves(shift, set())
        if len(maxes) != 1:
            continue
        (m,) = maxes
        if len(owned.get(m, [])) != 1:
            continue
        jm = owned[m][0]
        if slots[jm].op != "max" or slots[jm].var != m or slots[jm].level != s.level - 1:
            continue
        # X: inputs and row values of lower levels only (loaded, final in this pass)
        if any(v in owned and any(slots[i].level >= slots[jm].level for i in owned[v])
               for v in leaves(x, set())):  # fmt: skip
            continue
        out[j] = (jm, shift)
    return out


def _online_stage(k, mine, nxt, jm, online, slots, owned, by_var, needed, body) -> Stage:
    """The stage of level k computing its slots and the online sums of level k + 1 in one pass:
    the max is updated tile by tile first, the sums rescaled to its new shift, then added to."""
    own = [j for j in mine if slots[j].op != "scan"]
    t_of = {j: t for t, j in enumerate(own)}
    for i, j in enumerate(nxt):  # the sums' partials, then their shifts'
        t_of[j] = len(own) + i
    shift_t = {j: len(own) + len(nxt) + i for i, j in enumerate(nxt)}
    m = slots[jm]
    tm = t_of[jm]
    tile_max = _reduce("max", f"tl.where(mask, {m.arg} + tl.zeros([ROWS, BLOCK_N], tl.float32), "
                              f"{_NEUTRAL['max']})")  # fmt: skip
    extra = {m.var: [f"{m.var} = tl.maximum(acc{tm}, {tile_max})  # the running max"]}
    start = [by_var[_owner(slots[j].var, owned)].var for j in mine + nxt]
    need = needed(start[: len(mine)], k) | needed(start[len(mine) :], k + 1)
    lines = body(need, k, extra)
    for j in nxt:
        s, t, ts = slots[j], t_of[j], shift_t[j]
        shift = online[j][1]
        tile = f"tl.where(mask, {s.arg} + tl.zeros([ROWS, BLOCK_N], tl.float32), 0.0)"
        lines += [
            f"acc{t} = acc{t} * tl.where(acc{ts} == {shift}, 1.0, tl.exp(acc{ts} - {shift})) "
            f"+ {_reduce('sum', tile)}",
            f"acc{ts} = {shift} + tl.zeros([ROWS, 1], tl.float32)",
        ]
    wmeans = [j for j in own if slots[j].op == "wmean"]  # each keeps a shift after the rest
    for j in own:
        if j == jm:
            continue
        k_at = len(own) + 2 * len(nxt) + wmeans.index(j) if j in wmeans else -1
        lines += _accumulate(slots[j], t_of[j], k_at)
    lines.append(f"acc{tm} = {m.var}")
    return Stage(k, mine + nxt, lines, shifts=list(nxt), online_max=jm)


def _accumulate(s: Slot, t: int, k_at: int = -1) -> list[str]:
    """The lines adding a tile's reduction to the chunk's accumulator acc{t} (a var_mean's mean
    also keeps its shift in acc{k_at})."""
    if s.op == "wm2":
        return []  # merged with its mean (the slot before it)
    if s.op == "wmean":
        # Chan's update of (count, mean acc{t}, centered sum of squares acc{t+1}) by the tile's
        # own (two passes over the tile in registers); the count is alike for every row. Values
        # are taken relative to the chunk's shift acc{k_at}, its first tile's mean, so a row far
        # from 0 keeps its spread's digits (the launcher adds the shift back, in fp64)
        x = f"tl.where(mask, {s.arg} + tl.zeros([ROWS, BLOCK_N], tl.float32), 0.0)"
        u = t + 1
        return [
            f"n_t{t} = tl.minimum(N - start, BLOCK_N).to(tl.float32)",
            "if start == chunk * CHUNK:  # the chunk's first tile: its mean is the shift",
            f"    acc{k_at} = {_reduce('sum', x)} / n_t{t}",
            f"d_t{t} = tl.where(mask, {s.arg} - acc{k_at}, 0.0)",
            f"m_t{t} = {_reduce('sum', f'd_t{t}')} / n_t{t}",
            f"d_t{t} = tl.where(mask, d_t{t} - m_t{t}, 0.0)",
            f"q_t{t} = {_reduce('sum', f'd_t{t} * d_t{t}')}",
            f"w_t{t} = n_t{t} / (cnt{t} + n_t{t})",
            f"e_t{t} = m_t{t} - acc{t}",
            f"acc{u} += q_t{t} + e_t{t} * e_t{t} * cnt{t} * w_t{t}",
            f"acc{t} += e_t{t} * w_t{t}",
            f"cnt{t} += n_t{t}",
        ]
    base_op = s.op[3:] if s.op.startswith("arg") else s.op
    tile = f"tl.where(mask, {s.arg} + tl.zeros([ROWS, BLOCK_N], tl.float32), {_NEUTRAL[base_op]})"
    red = _reduce(base_op, tile)
    if s.op.startswith("arg"):  # a tile's extreme replaces the chunk's only if beyond it
        better = ">" if base_op == "max" else "<"
        return [
            f"ext{t} = {red}",
            f"at{t} = start + tl.arg{base_op}({tile}, axis=1)[:, None]",
            f"idx{t} = tl.where(ext{t} {better} acc{t}, at{t}, idx{t})",
            f"acc{t} = tl.where(ext{t} {better} acc{t}, ext{t}, acc{t})",
        ]
    if s.op == "sum":
        return [f"acc{t} += {red}"]
    if s.op == "prod":
        return [f"acc{t} *= {red}"]
    fn = "maximum" if s.op == "max" else "minimum"
    return [f"acc{t} = tl.{fn}(acc{t}, {red})"]


def _owner(slot_var: str, owned: dict[str, list[int]]) -> str:
    """The reduction var a slot belongs to (var_mean's slots are <var>_1 and <var>_0, var's
    <var>_1 and <var>)."""
    if slot_var in owned:
        return slot_var
    return slot_var.rsplit("_", 1)[0]


def kernels(
    em,
    kind: str,
    groups,
    roots: list[str],
    used: list[int],
    ph: list[str],
    n_dys: int,
    outs: list[dict],
    given: dict[str, int] | None = None,
) -> dict:
    """The template's view of one direction's looped kernels ("fwd" or "bwd"): `used` are the
    input indices the launcher's `ins` list holds, in order; `outs` the stored values; `given`
    as in `plan` (the forward's `keep`)."""
    import re

    p = plan(em, groups, roots, given)

    def reads(lines: list[str]) -> dict:
        text = "\n".join(lines)
        ins = [
            (i, pos) for pos, i in enumerate(used) if re.search(rf"\bf_{re.escape(ph[i])}\b", text)
        ]
        dys = [d for d in range(n_dys) if re.search(rf"\bdy_{d}\b", text)]
        return {"ins": ins, "dys": dys}

    parts = []
    for st in p.stages:
        slots, scans = [], []
        for j in st.slots:
            s = p.slots[j]
            info = {"var": s.var, "op": s.op, "post": s.post, "index": j, "reverse": s.reverse,
                    "prod": s.target == "aten.cumprod.default",
                    "neutral": "sum" if s.op in ("wmean", "wm2") else s.op}  # fmt: skip
            if s.op == "wm2":  # merged with its mean (the slot before it)
                slots[-1][1]["m2"] = {"t": len(slots), "index": j, "post": s.post}
            if s.op == "scan":
                scans.append((s.scan, info))
            else:
                slots.append((len(slots), info))
        # an online sum: combined through its chunks' shifts and the row's max (t indices)
        t_max = next((t for t, i in slots if i["index"] == st.online_max), -1)
        for j in st.shifts:
            t = next(t for t, i in slots if i["index"] == j)
            slots[t][1]["online"] = (t_max, len(slots))
            slots.append((len(slots), {"var": f"the shift of {p.slots[j].var}", "op": "shift",
                                       "neutral": "max", "index": -1}))  # fmt: skip
        # a var_mean's mean: its chunk's shift, one more partial (in _accumulate's order)
        for info in [i for _, i in slots if i["op"] == "wmean"]:
            info["shift"] = len(slots)
            slots.append((len(slots), {"var": f"the shift of {info['var']}", "op": "wshift",
                                       "neutral": "sum", "index": -1}))  # fmt: skip
        # a pick stage reads its index input before the lines (the column is computed first)
        chain = [f"f_{ph[st.pick[0]]}", *st.pick[1]] if st.pick else []
        parts.append({"level": st.level, "lines": st.lines, "slots": slots, "scans": scans,
                      "pick": st.pick, **reads(chain + st.lines)})  # fmt: skip
    # the combine kernels find the first chunk at a row's extreme (argmax/argmin, online sums)
    has_first = any(i["op"].startswith("arg") or "online" in i
                    for part in parts for _, i in part["slots"])  # fmt: skip
    last_text = p.final + [o["value"] for o in outs]
    last = {"lines": p.final, **reads(last_text)}
    return {
        "kind": kind,
        "unsupported": None,
        "parts": parts,
        "last": last,
        "outs": outs,
        "n_slots": max(1, len(p.slots)),
        "max_slots": max(
            (
                sum(1 for j in st.slots if p.slots[j].op != "scan")
                + len(st.shifts)
                + sum(1 for j in st.slots if p.slots[j].op == "wmean")
                for st in p.stages
            ),
            default=1,
        ),
        "n_scans": sum(1 for s in p.slots if s.op == "scan"),
        "has_arg": any(s.op.startswith("arg") for s in p.slots),
        "has_first": has_first,
        # the row values this launch keeps for a later one ({var: slot}; see `plan`), and the
        # ones it copies from a kept set ([(slot, kept slot)])
        "keep": {s.var: j for j, s in enumerate(p.slots) if s.op in _GIVEN},
        "given": p.given,
    }
