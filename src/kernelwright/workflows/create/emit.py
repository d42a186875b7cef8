"""The node-by-node emitter behind codegen: a profile's forward and backward graphs as lines
of `tl` code on [ROWS, BLOCK_N] fp32 tiles (`f_<node>` forward, `b_<node>` backward), the row's
reductions and scans lowered in place, and the analysis of what the backward reads (inputs,
stored intermediates, output gradients) and how each input's gradient is summed.
"""

from __future__ import annotations

import re

from kernelwright.profiles.kernel import GraphNode, KernelProfile
from kernelwright.workflows.create.lowering import (
    _ARG_REDUCE,
    _CONSTS,
    _IDENTITY,
    _NEUTRAL,
    _REDUCE,
    _SCANS,
    _SUM,
    UnsupportedNode,
    _lit,
    _lower,
    _output_args,
    _refs,
    _users,
)
from kernelwright.workflows.create.onehot import ONE_HOT
from kernelwright.workflows.create.onehot import lower as lower_one_hot


class _Emitter:
    """Straight-line kernel body: forward nodes as f_<name>, backward nodes as b_<name>."""

    def __init__(self, profile: KernelProfile):
        self.p = profile
        self.row_grads: set[int] = set()  # inputs whose gradient the kernel stores per row
        self.fwd = [n for n in profile.forward.nodes]
        self.bwd = [n for n in profile.backward.nodes]
        self.fwd_by = {n.name: n for n in self.fwd}
        self.bwd_by = {n.name: n for n in self.bwd}
        self.f_ph = [n.name for n in self.fwd if n.op == "placeholder"]
        if len(self.f_ph) != len(profile.inputs):
            raise UnsupportedNode(
                "placeholder",
                f"the forward graph has {len(self.f_ph)} placeholders for "
                f"{len(profile.inputs)} profile inputs; re-run Understand",
            )
        main = next((i for i in profile.inputs if i.broadcast == "full"), profile.inputs[0])
        self.full = list(main.example_shape)  # the traced shape of the main input
        self.rank = len(self.full)
        # the row: the reduced dims (non-negative, ascending; the last dim without reductions);
        # the kernel sees every tensor as [rows, cols] with these dims as cols, moved last by
        # the launcher when they are not the trailing dims
        self.reducing = bool(profile.reduction_dims)
        self.block = sorted({d % self.rank for d in profile.reduction_dims or [-1]})
        self.trailing = self.block == list(range(self.rank - len(self.block), self.rank))
        self.row_n = 1
        for d in self.block:
            self.row_n *= self.full[d]
        # a row kernel iff some reduction runs over the row (parameter-gradient sums over the
        # rows alone stay trailing sums of an element-wise kernel, as for DyT)
        self.row = any(self.reduce_kind(n) == "row" for n in self.fwd + self.bwd)
        # the profile's decision: intermediates the forward stores and the backward loads (as
        # s_<name>); everything else the backward recomputes from the inputs
        self.stored = {t.name: t for t in profile.stored}
        # set by staged.plan while it emits: a row reduction's var -> the lines loading its
        # row values from the launcher's buffer (None: reductions are computed in place)
        self.loads: dict[str, list[str]] | None = None
        # and a scan's carry into the current tile (the sum of the row before it), by var
        self.carry: dict[str, str] = {}
        # the values that are a flipped row, by var: the code of the same row unflipped (one
        # kernel body; reset by its caller before the first group)
        self.flipped: dict[str, str] = {}
        # set by pick.py while it emits a forward that reads one element per row: a gather is
        # then the value at the row's target column (`mask`: the row and its index are valid)
        self.picked = False
        # set while the forward's one-tile kernel is emitted: a one_hot's index outside the row
        # also sets the kernel's index flag (flag_ptr; runtime.checks.index_flag)
        self.index_flag = False

    @property
    def shaped_ph(self) -> list[str]:
        """The inputs that broadcast to the full shape (not per-row ones traced as [...])."""
        dropped = self.rank - len(self.block)
        return [
            ph
            for ph, s in zip(self.f_ph, self.p.inputs, strict=True)
            if not (s.broadcast == "row" and len(s.example_shape) == dropped)
        ]

    @property
    def classic(self) -> bool:
        """The row is the last dim alone: shapes of any rank share the kernel."""
        return self.block == [self.rank - 1]

    @property
    def kept(self) -> list[int]:
        return [d for d in range(self.rank) if d not in self.block]

    @property
    def n_expr(self) -> str:
        """The runtime row length in the reference, from its `_shape`."""
        if self.classic:
            return "_shape[-1]"
        return "(" + " * ".join(f"_shape[{d}]" for d in self.block) + ")"

    def _shape(self, name) -> list[int] | None:
        node = self.fwd_by.get(name) or self.bwd_by.get(name)
        return node.shape if node is not None else None

    def row_shape(self, keepdim: bool) -> list[int]:
        """The traced shape of one value per row: reduced dims dropped, or kept as 1."""
        if keepdim:
            return [1 if d in self.block else s for d, s in enumerate(self.full)]
        return [s for d, s in enumerate(self.full) if d not in self.block]

    def row_dims(self, dims) -> bool:
        """Whether `dims` (an int or a list, any sign) are the row's dims."""
        dims = [dims] if isinstance(dims, int) else list(dims)
        return self.rank > 0 and sorted({d % self.rank for d in dims}) == self.block

    def reduce_kind(self, n: GraphNode) -> str | None:
        """'row' (over the row's dims), 'rows' (other dims: a trailing sum), None."""
        if n.op != "call_function" or n.target not in _REDUCE:
            return None
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        if not self.rank:
            return "rows"
        if n.target == "aten.sum.default" or dims is None or dims == []:
            norm = list(range(self.rank))  # every dim
        else:
            dims = [dims] if isinstance(dims, int) else list(dims)
            norm = sorted({d % self.rank for d in dims})
        if norm == self.block and (self.reducing or n.target != "aten.sum.default"):
            return "row"
        return "rows"  # summed to the input's shape by the launcher

    def _arg(self, x, prefix: str, names: set[str], alias: dict[str, str]) -> str:
        if isinstance(x, str) and x in names:
            return alias.get(x, prefix + x)
        if isinstance(x, str) and x in _CONSTS:  # inf/nan constants kept as text in YAML
            return _lit(_CONSTS[x])
        return _lit(x) if isinstance(x, (int, float)) else repr(x)

    def _is_n(self, n: GraphNode, x) -> bool:
        # AOT Autograd bakes the traced row length into mean's backward and the norms'
        # gradients (`div(expand, 96)`), take_along_dim into its index wrap (`remainder(idx,
        # 96)`): in a row kernel an int equal to it is the runtime N
        base = n.target.rsplit(".", 1)[0]
        return (
            self.row
            and base in ("aten.mul", "aten.div", "aten.remainder")
            and isinstance(x, int)
            and not isinstance(x, bool)
            and self.rank > 0
            and x == self.row_n
        )

    def n_frac(self, n: GraphNode, x) -> int | None:
        """k when the float `x` is k / (the traced row length), |k| = 1..4: a constant folded from
        a mean's backward (mse_loss's 2 / N), the runtime k / N in a row kernel."""
        if not (self.row and isinstance(x, float) and n.target.rsplit(".", 1)[0] in
                ("aten.mul", "aten.div") and self.row_n > 8):  # fmt: skip
            return None
        k = round(x * self.row_n)
        return k if 1 <= abs(k) <= 4 and abs(x * self.row_n - k) < 1e-9 * abs(k) else None

    def n1_frac(self, n: GraphNode, x) -> int | None:
        """k when `x` is k / (N - 1): the unbiased variance's folded 2 / (N - 1)."""
        if self.n_frac(n, x) is not None or not self.row or self.row_n <= 8:
            return None
        if not isinstance(x, float) or n.target.rsplit(".", 1)[0] not in ("aten.mul", "aten.div"):
            return None
        k = round(x * (self.row_n - 1))
        return k if 1 <= abs(k) <= 4 and abs(x * (self.row_n - 1) - k) < 1e-9 * abs(k) else None

    def fwd_needed(self, roots: list[str], stop: frozenset[str] = frozenset()) -> list[GraphNode]:
        """The forward nodes computing `roots`, in graph order; `stop`: values already at hand
        (loaded stored intermediates), neither recomputed nor walked through."""
        need: set[str] = set()
        stack = [r for r in roots if r in self.fwd_by and r not in stop]
        names = set(self.fwd_by) - stop
        while stack:
            r = stack.pop()
            if r in need:
                continue
            need.add(r)
            n = self.fwd_by[r]
            stack.extend(_refs(n.args, names) + _refs(list(n.kwargs.values()), names))
        return [n for n in self.fwd if n.name in need and n.op != "output"]

    def _reduce(
        self, n: GraphNode, a: str, prefix: str, code: list[str], out: str | None = None
    ) -> list[str]:
        """A last-dim reduction of the [ROWS, BLOCK_N] tile `a` → [ROWS, 1] line(s)."""
        out = out or prefix + n.name
        if self.loads is not None:
            return self.loads.get(out, [])
        base = n.target.rsplit(".", 1)[0]

        def red(op: str, v: str) -> str:
            return f"tl.{op}(tl.where(cmask, {v}, {_NEUTRAL[op]}), axis=1)[:, None]"

        if base == "aten.sum":
            return [f"{out} = {red('sum', a)}"]
        if base == "aten.mean":
            return [f"{out} = {red('sum', a)} / N"]
        if base in ("aten.amax", "aten.amin"):
            return [f"{out} = {red(base[-3:], a)}"]
        if n.target in _ARG_REDUCE or base in ("aten.argmax", "aten.argmin"):
            # (values, indices); the first index of the extreme value, as torch
            op = _ARG_REDUCE.get(n.target) or base[-3:]
            arg = f"tl.arg{op}(tl.where(cmask, {a}, {_NEUTRAL[op]}), axis=1)[:, None]"
            if base in ("aten.argmax", "aten.argmin"):
                return [f"{out} = {arg}"]
            return [f"{out}_0 = {red(op, a)}", f"{out}_1 = {arg}"]
        if n.target in _SCANS:  # a scan along the row: the padding adds (multiplies) nothing
            fn, _, pad = _SCANS[n.target]
            return [f"{out} = {fn}(tl.where(cmask, {a}, {pad}), axis=1)"]
        if base == "aten.prod":  # _mul: the generated module's product combine
            return [f"{out} = tl.reduce(tl.where(cmask, {a}, 1.0), 1, _mul)[:, None]"]
        if base == "aten.gather":  # one value per row at its target column
            if list(n.shape or []) != self.row_shape(True):
                raise UnsupportedNode(n.name, "a gather of more than one value per row")
            if self.picked:
                return [f"{out} = tl.where(mask, {a}, 0.0)"]
            return [f"{out} = {red('sum', f'tl.where(cols == {code[2]}, {a}, 0.0)')}"]
        # var_mean: (var, mean), two-pass over the row in registers (no cancellation); var
        # alone the same, named <out>
        corr = n.kwargs.get("correction", 1)
        corr = 1 if corr is None else corr
        var = out if base == "aten.var" else f"{out}_0"
        return [
            f"{out}_1 = {red('sum', a)} / N",
            f"{out}_c = {a} - {out}_1",
            f"{var} = {red('sum', f'{out}_c * {out}_c')} / (N - {_lit(corr)})",
        ]

    def varies_along_row(self, name) -> bool:
        """Whether the value `name` (a node or input) holds more than one value along the row
        (a per-row value, a scalar or a constant broadcasts along it)."""
        if not isinstance(name, str):
            return False
        if name in self.f_ph and self.p.inputs[self.f_ph.index(name)].broadcast == "row":
            return False
        shape = self._shape(name)
        if shape is None:
            return True
        off = self.rank - len(shape)  # a lower rank broadcasts from the right
        return off < 0 or any(shape[d - off] != 1 for d in self.block if d >= off)

    def _flipped_op(self, n: GraphNode, code: list[str], out: str, kind) -> list[str]:
        """A node reading a flipped row (kept unflipped in `self.flipped`): element-wise ops and
        reductions whose value does not depend on the order commute with the flip."""
        flipped = self.flipped
        base = n.target.rsplit(".", 1)[0]
        if kind == "row":
            if base in ("aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.prod",
                        "aten.var_mean", "aten.var") and code[0] in flipped:  # fmt: skip
                return self._reduce(n, flipped[code[0]], "", [flipped[code[0]]], out)
            raise UnsupportedNode(n.name, f"{n.target} of a flipped row (order-dependent)")
        if (
            kind == "rows"
            or n.target == "getitem"
            or n.target.startswith(("aten.scatter", "aten.gather"))
        ):
            raise UnsupportedNode(n.name, f"{n.target} of a flipped row")
        # f(flip(a), flip(b), c) = flip(f(a, b, c)) for c constant along the row
        mixed = [a for a, c in zip(n.args, code, strict=True)
                 if c not in flipped and self.varies_along_row(a)]  # fmt: skip
        if mixed:
            raise UnsupportedNode(
                n.name, f"a flipped row combined with an unflipped one ({mixed[0]})"
            )
        src = [flipped.get(c, c) for c in code]
        if n.target in _IDENTITY or n.target in _SUM:
            expr = src[0]
        else:
            expr = _lower(n, src, list(n.args), dict(n.kwargs), self.row)
        flipped[out] = f"{out}_r"
        return [f"{out}_r = {expr}"]

    def emit(self, nodes: list[GraphNode], prefix: str, alias: dict[str, str]) -> list[str]:
        names = {n.name for n in nodes} | set(alias)
        by = {n.name: n for n in nodes}
        lines = []
        # a flip along the row is not a tile operation: flip(v) is kept as "v reversed" (the
        # unflipped code in self.flipped); a scan of it is the reversed scan (cumsum(flip(u)) is
        # flip(u's reversed cumsum)), element-wise ops of flipped rows and values constant
        # along the row are flipped results, order-free reductions read the unflipped row
        flipped = self.flipped
        for n in nodes:
            if n.op != "call_function":
                continue
            code = [
                "N" if self._is_n(n, x)
                else f"({self.n_frac(n, x)}.0 / N)" if self.n_frac(n, x)
                else f"({self.n1_frac(n, x)}.0 / (N - 1.0))" if self.n1_frac(n, x)
                else self._arg(x, prefix, names, alias)
                for x in n.args
            ]  # fmt: skip
            out = prefix + n.name
            if n.target == "aten.flip.default":
                if not self.row_dims(n.args[1]):
                    raise UnsupportedNode(n.name, f"a flip over dims {n.args[1]}: only the row")
                if code[0] in flipped:  # flip(flip(u)) = u
                    lines.append(f"{out} = {flipped[code[0]]}")
                else:
                    flipped[out] = code[0]
                continue
            if n.target in _SCANS and code[0] in flipped:
                fn, join, pad = _SCANS[n.target]
                carry = f" {join} {self.carry[out]}" if out in self.carry else ""
                lines.append(f"{out}_r = {fn}(tl.where(cmask, {flipped[code[0]]}, {pad}), "
                             f"axis=1, reverse=True){carry}")  # fmt: skip
                flipped[out] = f"{out}_r"
                continue
            kind = self.reduce_kind(n)
            if any(c in flipped for c in code):
                lines.extend(self._flipped_op(n, code, out, kind))
                continue
            if kind == "row":
                lines.extend(self._reduce(n, code[0], prefix, code))
                continue
            if (
                n.target == "getitem"
            ):  # an element of var_mean's (var, mean) or max's (value, index)
                src = by.get(n.args[0])
                pairs = ("aten.var_mean.correction", *_ARG_REDUCE)
                if src is None or src.target not in pairs or not self.row:
                    raise UnsupportedNode(
                        n.name, "getitem of anything but a row's var_mean or max/min"
                    )
                lines.append(f"{prefix}{n.name} = {code[0]}_{int(n.args[1])}")
                continue
            if kind == "rows" and n.target not in _SUM:
                raise UnsupportedNode(
                    n.name, f"{n.target} over dims {n.args[1:2]}: only the last dim is reduced"
                )
            if n.target.startswith("aten.scatter") and (
                not self.row or list(self._shape(n.args[2]) or []) != self.row_shape(True)
            ):
                raise UnsupportedNode(n.name, f"{n.target} of more than one value per row")
            if n.target == "aten.scatter.src":
                # scatter(base, dim, index, src): src at each row's index column, base elsewhere
                expr = f"tl.where(cols == {code[2]}, {code[3]}, {code[0]})"
            elif n.target == "aten.scatter_add.default":
                expr = f"({code[0]} + tl.where(cols == {code[2]}, {code[3]}, 0.0))"
            elif n.target in _IDENTITY or n.target in _SUM:
                expr = code[0]
            elif n.target == ONE_HOT:  # the mask of the row's index column
                expr = lower_one_hot(self, n, code)
                if self.index_flag:
                    bad = f"(({code[0]} < 0) | ({code[0]} >= N))"
                    lines.append(f"tl.store(flag_ptr + {bad}.to(tl.int32) * 0, 1, mask={bad})")
            else:
                expr = _lower(n, code, list(n.args), dict(n.kwargs), self.row)
            lines.append(f"{prefix}{n.name} = {expr}")
        return lines

    def forward_body(self) -> tuple[list[str], list[str]]:
        outs = _output_args(self.fwd)[: len(self.p.outputs)]
        for n in self.fwd:
            if self.reduce_kind(n) == "rows":
                raise UnsupportedNode(
                    n.name,
                    f"a reduction over dims {n.args[1:2] or 'all'} in the forward: a row kernel "
                    "reduces the last dim only",
                )
        self.flipped = {}
        body = self.emit(self.fwd_needed(outs + list(self.stored)), "f_", {})
        for name in outs + list(self.stored):
            if "f_" + name in self.flipped:
                raise UnsupportedNode(name, "an output or stored value that is a flipped row")
        return body, ["f_" + o for o in outs]

    def stored_kinds(self) -> list[str]:
        """Per stored intermediate: 'full' ([..., N]), 'row' ([...]) or 'row1' ([..., 1])."""
        kinds = []
        for name in self.stored:
            shape = self.fwd_by[name].shape
            if shape == self.full:
                kinds.append("full")
            elif self.row and shape == self.row_shape(False):
                kinds.append("row")
            elif self.row and shape == self.row_shape(True):
                kinds.append("row1")
            else:
                raise UnsupportedNode(
                    name,
                    f"stored intermediate of shape {shape}: only the main input's {self.full}"
                    + (" or one value per row" if self.row else "")
                    + " is stored; recompute it instead (remove it from stored)",
                )
        return kinds

    def _row_grad_source(self, g: str, i: int) -> tuple[str, list[str]]:
        """The full-size value whose row sum is the per-row input i's gradient `g`, and the
        nodes from that sum to `g` (the launcher's work, not the kernel's)."""
        shape = list(self.p.inputs[i].example_shape)
        if shape == self.row_shape(False) and not self.classic:
            raise UnsupportedNode(
                g,
                f"the gradient of a per-row input of shape {shape} (the row's dims dropped) "
                "with a row of other dims than the last: keep them as 1 "
                f"({self.row_shape(True)})",
            )
        if shape not in (self.row_shape(True), self.row_shape(False)):
            raise UnsupportedNode(
                g,
                f"the gradient of a per-row input of shape {shape}: one value per row is "
                f"{self.row_shape(True)} or {self.row_shape(False)}",
            )
        chain, cur = [], g
        while isinstance(cur, str) and cur in self.bwd_by and self.bwd_by[cur].target in _IDENTITY:
            chain.append(cur)  # a squeeze or view of the row sum
            cur = self.bwd_by[cur].args[0]
        node = self.bwd_by.get(cur) if isinstance(cur, str) else None
        chain.append(cur)
        users = _users(self.bwd)
        if (
            node is None
            or node.target not in _SUM
            or self.reduce_kind(node) != "row"
            or not self.varies_along_row(node.args[0])
            or any(
                u.op != "output" and u.name not in chain for c in chain for u in users.get(c, [])
            )  # fmt: skip
        ):
            raise UnsupportedNode(
                g, "the gradient of a per-row input that is not the row's sum of a full-size value"
            )
        return node.args[0], chain

    def backward_body(self) -> tuple[list[str], list[str | None], list[bool], set[int]]:
        """Lines, the value per input gradient, whether each was summed, inputs needed."""
        b_ph = [n.name for n in self.bwd if n.op == "placeholder"]
        alias: dict[str, str] = {}
        recompute: list[str] = []
        # a backward placeholder is a forward input, a forward intermediate, or (in order)
        # the gradient of one output ("tangents_1" from aot_function, "dy" from Understand)
        n_tangents = 0
        for ph in b_ph:
            if ph in self.f_ph:
                alias[ph] = "f_" + ph
            elif ph in self.stored:
                alias[ph] = "s_" + ph  # stored by the forward kernel: loaded
            elif ph in self.fwd_by:
                alias[ph] = "f_" + ph  # a saved intermediate: recomputed from the inputs
                recompute.append(ph)
            elif n_tangents < len(self.p.outputs):
                alias[ph] = f"dy_{n_tangents}"
                n_tangents += 1
            else:
                raise UnsupportedNode(ph, "a backward input that is neither saved nor a gradient")
        # a backward node recomputing a stored forward node (same name) is the loaded value
        for name in self.stored:
            alias.setdefault(name, "s_" + name)
        loaded = {k: v for k, v in alias.items() if k in self.stored}
        self.flipped = {}
        fwd_lines = self.emit(self.fwd_needed(recompute, frozenset(self.stored)), "f_", loaded)
        bwd_nodes = [n for n in self.bwd if not (n.op == "call_function" and n.name in self.stored)]
        grads = _output_args(self.bwd)
        users = _users(self.bwd)
        values: list[str | None] = []
        summed: list[bool] = []
        row_sums: set[str] = set()  # per-row gradients' row sums, done by the launcher
        self.row_grads = set()

        def trailing(name) -> bool:
            node = self.bwd_by.get(name)
            return node is not None and (
                node.target in _IDENTITY
                or (node.target in _SUM and self.reduce_kind(node) != "row")
            )

        for i, g in enumerate(grads[: len(self.p.inputs)]):
            if g is None:
                values.append(None)
                summed.append(False)
                continue
            if self.row and self.p.inputs[i].broadcast == "row":
                # one value per row: the row's sum of a full-size value. With the row's dims
                # trailing the kernel sums it (a row reduction like any other) and stores one
                # value per row; otherwise the full-size value is written in fp32 and summed to
                # the input's shape, as other broadcast inputs'
                full, chain = self._row_grad_source(g, i)
                if self.trailing:
                    row_sums.update(chain[:-1])  # the shape ops after the sum
                    self.row_grads.add(i)
                    values.append("b_" + chain[-1])
                else:
                    row_sums.update(chain)
                    values.append(alias.get(full, "b_" + full))
                summed.append(True)
                continue
            # walk back through shape ops and one trailing sum to the full-size value
            was_summed, cur = False, g
            while isinstance(cur, str) and trailing(cur):
                was_summed |= self.bwd_by[cur].target in _SUM
                cur = self.bwd_by[cur].args[0]
            values.append(alias.get(cur, "b_" + cur) if isinstance(cur, str) else None)
            summed.append(was_summed)
        for n in self.bwd:
            if n.target in _REDUCE and self.reduce_kind(n) == "rows":
                # a sum over rows feeding anything else than shape ops would need a cross-row
                # reduction inside the kernel
                bad = [u.name for u in users.get(n.name, [])
                       if u.op != "output" and u.target not in _IDENTITY]  # fmt: skip
                if bad or n.target not in _SUM:
                    raise UnsupportedNode(
                        n.name,
                        f"{n.target} over rows feeding {bad or 'a gradient'}: a cross-row "
                        "reduction inside the kernel (tier 3)",
                    )
        bwd_nodes = [n for n in bwd_nodes if n.name not in row_sums]
        self.bwd_groups = [
            (self.fwd_needed(recompute, frozenset(self.stored)), "f_", loaded),
            (bwd_nodes, "b_", alias),
        ]
        body = fwd_lines + self.emit(bwd_nodes, "b_", alias)
        flipped = [v for v in values if v in self.flipped]
        if flipped:
            raise UnsupportedNode(flipped[0], "a gradient that is a flipped row")
        text = "\n".join(body + [v or "" for v in values])
        needed = {i for i, ph in enumerate(self.f_ph) if f"f_{ph}" in text}
        unread = [s for s in self.stored if not re.search(rf"\bs_{re.escape(s)}\b", text)]
        if unread:
            raise UnsupportedNode(
                unread[0], "stored, but the backward never reads it: remove it from stored"
            )
        return body, values, summed, needed
