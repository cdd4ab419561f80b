r"""The parallel-branch sampler: batched lanes over one KV cache, forked into branches, merged after.

A *lane* is one sequence being decoded, one row of the cache (kvcache.py); every lane decodes in
the same forward. Structured mode (Unseen): a lane that writes the schema's fork tag is *forked*
into K branch lanes (copies of its row), branch k forced to open its path at `layout.path_start`;
a branch that closes its path leaves its cache piece with its block and its row goes; when the
last one closes, the pieces are joined into one row, prefix ‖ path₁ ‖ … ‖ path_K as decoded (zero
recompute), fed the merge tags at `layout.after_block`. One prompt q, K = 3, stride 0:

    forward  fed @ position        rows after it (b1 b2 b3: the branches)
    1-3      a @1, b @2, P @3      0: q a b P                 P read: fork, row 0 copied three times
    4        A @4 (each branch)    b1: q a b P A   b2: q a b P A   b3: q a b P A   (stride s: bk's A @4 + (k-1)s)
    5        x y z @5              b1: … A x       b2: … A y       b3: … A z
    6        / y z @6              b1: … A x /     b2: … A y y     b3: … A z z     b1 closed: piece q a b P A x /
    7        / z @7                b2: … A y y /   b3: … A z z z                   b2 closed: piece A y y /
    8        / @8                  b3: … A z z z /                                 last: piece A z z z /, joined
    9        \ @9 (4 + longest 5)  0: q a b P A x / A y y / A z z z / \            S forced next, @10

(P <Parallel>, A <Path>, / </Path>, \ </Parallel>, S <Summary>.) NPR (`tags.NPR`) differs only in
named helpers: it forks at </guideline>, one branch per plan (`branch_count`), a branch opens
<step> and its label "k:" (`path_opening`), the merge feeds <takeaway> (`merge_tags`), and the
plans are capped (`plan_bans`). Causal mode (Seen) is plain decoding: the model writes every tag
itself, later paths see earlier ones as training reads them. Inserted tokens are marked not
sampled: never trained on (NPR's and Parallel-R1's released codes train them: grpo.py). Not here: prompts (prompts.py), rewards, gradients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from . import NanoparError
from .kvcache import LaneCache, LazyLaneCache, Piece, join
from .layout import after_block, build_layout, mask_dtype, path_start, sliding_window
from .draw_in_place import DRAW_IN_PLACE_FROM_VOCAB, CallDraw
from .policy import Policy
from .tags import MAX_PATHS
from .trace import Trace, parse_ids, read_tag, trace_stats


@dataclass
class SamplerSettings:
    """Budgets and draw knobs of one sampler call. The defaults are the one set every script
    starts from, the toy world's (its teacher writes 3 paths, each within 48 tokens, every trace
    within 224); a real model gets defaults.REAL_SAMPLING instead."""

    # sampling
    paths: int = 3  # [basic] K: paths opened by every <Parallel> (structured; causal: the model writes its own); NPR: the most plans a guideline may hold (default 5, NPR's engine's)
    max_new_tokens: int = 224  # [basic] sampled tokens per response, counted over all its branches
    max_blocks: int = 4  # parallel blocks per response; then <Parallel> cannot be drawn (Parallel-R1's engine ends the response there, NPR's has no cap: docs/recipes.md)
    max_path_tokens: int = 48  # sampled tokens per path; then </Path> is inserted
    top_p: float = 1.0  # nucleus sampling; 1.0 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    seed: int | None = None  # seeds this call's draws; None = torch's global generator

    def check(self) -> None:
        if not 2 <= self.paths <= MAX_PATHS:
            raise NanoparError(f"paths per block must be between 2 and {MAX_PATHS}, got {self.paths}")
        if min(self.max_new_tokens, self.max_path_tokens) < 1 or self.max_blocks < 0:
            raise NanoparError("token budgets must be >= 1 and max_blocks >= 0")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise NanoparError(f"top_p must be in (0, 1] and top_k >= 0, got {self.top_p} and {self.top_k}")

    def longest_row(self, prompt_tokens: int) -> int:
        """Tokens of the longest row a response can grow to: prompt + sampled + inserted tags (per
        block: K forced <Path>, up to K inserted </Path>, the two merge tags </Parallel><Summary>).
        Parallel-R1's schema; NPR's forced step labels can pass it (the lazy lane cache then copies
        per step beyond it, correct but slower; bench/memory.py plans Parallel-R1's rows)."""
        return prompt_tokens + self.max_new_tokens + self.max_blocks * (2 * self.paths + 2)

    @classmethod
    def from_flags(cls, config, **changes) -> "SamplerSettings":
        """The sampler's fields of a script's config that extends this class (train.py, eval.py, ...)."""
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__} | changes)


@dataclass
class RolloutStats:
    new_tokens: int  # response tokens, sampled and inserted
    sampled_tokens: int  # tokens drawn from the policy (what max_new_tokens bounds)
    forks: int  # blocks opened: block tags written (<Parallel>; NPR: <guideline>, forked or cut before </guideline>)
    path_lengths: list[list[int]]  # per fork, in order: its paths' tokens ([]: the response ended before its paths)
    critical_path: int  # response tokens on the longest route (paths of a block side by side)
    stray_tags: int  # tags sampled where they mean nothing, kept as text
    cut_paths: int  # paths closed by an inserted </Path> (length limit, EOS, budget)
    wall_time: float  # seconds of the whole sampling call (shared by its responses)
    peak_cache_bytes: int  # largest size of the batched KV cache during the call (shared)


@dataclass
class Rollout:
    prompt_ids: list[int]  # the prompt, unpadded
    ids: list[int]  # the response in trace order (paths of a block one after another)
    sampled: list[bool]  # per response token: drawn from the policy (True) or inserted (False)
    logprobs: list[float]  # per response token: policy log-prob (0.0 for inserted tokens)
    trace: Trace  # parse_ids(ids): the structure the trainer's layout will read
    finish: str  # "eos" or "length"
    stats: RolloutStats


@dataclass
class _Tokens:
    """A run of response tokens: the main chain, or one path while it is decoded."""

    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, token: int, sampled: bool, logprob: float = 0.0) -> None:
        self.ids.append(token)
        self.sampled.append(sampled)
        self.logprobs.append(logprob if sampled else 0.0)

    def extend(self, other: "_Tokens") -> None:
        self.ids += other.ids
        self.sampled += other.sampled
        self.logprobs += other.logprobs


@dataclass
class _Block:
    """A block in flight: its paths' tokens, and the cache piece of each path once it is closed."""

    start: int  # rotary position of the first path's <Path> (path k: layout.path_start)
    paths: list[_Tokens]
    pieces: list[Piece | None] = field(init=False)  # per path: its cache piece, None while open

    def __post_init__(self):
        self.pieces = [None] * len(self.paths)

    def keep_piece(self, k: int, cache: LaneCache, row: int) -> None:
        """Path k is closed on cache row `row`: keep its columns. Every branch's row starts with the
        same prefix (a copy of the parent's), so path 0's piece keeps it and the others keep only
        their own tokens: joined, the pieces are the prefix once, then each path as decoded.

            path 0's row   q a b P A x /      piece 0: q a b P A x /   (all of it)
            path 1's row   q a b P A y y /    piece 1:         A y y / (its last len(path 1) columns)
            path 2's row   q a b P A z z z /  piece 2:         A z z z /
            merged_row     q a b P A x / A y y / A z z z /
        """
        whole = cache.lens[row]
        start = 0 if k == 0 else whole - len(self.paths[k].ids)
        self.pieces[k] = cache.piece(row, start, whole)

    @property
    def closed(self) -> bool:
        return all(piece is not None for piece in self.pieces)

    def merged_row(self) -> Piece:
        """The cache row of the merged lane: prefix ‖ path₁ ‖ … ‖ path_K, as decoded."""
        return join(self.pieces)


@dataclass
class _Response:
    prompt: list[int]
    tokens: _Tokens = field(default_factory=_Tokens)
    sampled: int = 0
    forks: int = 0  # blocks opened
    plans: int = 0  # plans closed in the block being written (NPR): its branch count
    stray: int = 0
    cut: int = 0
    path_lengths: list[list[int]] = field(default_factory=list)
    block: _Block | None = None  # the block in flight
    finish: str | None = None

    def take_block(self) -> _Block:
        """The block in flight, ended: its paths are written into the response, one after another."""
        block, self.block = self.block, None
        self.path_lengths.append([len(path.ids) for path in block.paths])
        for path in block.paths:
            self.tokens.extend(path)
        return block


@dataclass
class _Lane:
    response: int  # index of the response it writes
    state: str  # reading state (trace.read_tag): "main", "summary", "path", ...
    position: int  # rotary position of `pending`
    pending: int  # the token the next forward feeds
    out: _Tokens  # where its tokens go: the response's tokens, or its path's
    forced: list[int] = field(default_factory=list)  # tokens to insert before sampling resumes
    action: str | None = None  # what happens once `pending` is fed: "fork" or "end_path" (structured)
    path: int = -1  # its index in the block (branches only)
    path_sampled: int = 0  # sampled tokens in this path


@torch.no_grad()
def sample(
    model,
    prompts: list[list[int]],
    policy: Policy,  # tags (None: plain decoding), mode, temperature, vocabulary: what the trainer reads
    settings: SamplerSettings,  # budgets and draw knobs
    eos_ids: list[int],
    samples_per_prompt: int = 1,  # G: responses per prompt (prompt-major order)
    lane_cache: type[LaneCache] | None = None,  # None: `cache_for_vocabulary`; either samples the very same tokens
) -> list[Rollout]:
    """Sample responses to `prompts` (lists of token ids) with parallel branches."""
    settings.check()
    if not prompts or min(map(len, prompts)) == 0:
        raise NanoparError("sample() needs at least one prompt, and no empty prompt")
    from .lora_dtype import casts_kept  # here, not above: it imports bitsandbytes, which a LoRA model has loaded already

    started = time.perf_counter()
    was_training = model.training
    model.eval()
    generator = None
    if settings.seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(settings.seed)
    decoder = _Decoder(model, policy, settings, set(eos_ids), generator, lane_cache)
    try:
        with casts_kept(model):  # the adapter cannot change during the call: each layer casts it once
            rollouts = decoder.run(prompts, samples_per_prompt)
    finally:
        model.train(was_training)
    wall = time.perf_counter() - started
    for r in rollouts:
        r.stats.wall_time, r.stats.peak_cache_bytes = wall, decoder.peak_cache_bytes
    return rollouts


def cache_for_vocabulary(vocabulary: int) -> type[LaneCache]:
    """The lane cache `sample` uses for a model of `vocabulary` logits: the lazy one from the draw's
    threshold (a real model, where the copies it spares matter), the plain one below it (the toy,
    tiny models), where a debugger steps through the copy a reader expects."""
    return LazyLaneCache if vocabulary >= DRAW_IN_PLACE_FROM_VOCAB else LaneCache


class _Decoder:
    """One call of `sample`: the lanes, their cache, and the decode loop.

    Rules, counted in the stats, never raised: a tag sampled where it means nothing is plain text;
    EOS ends the response (structured, in a path: the path); `max_path_tokens` closes a path with
    an inserted close tag; a spent `max_new_tokens` (counted over all branches) ends the response
    (structured: its open paths are closed); after `max_blocks` blocks the block tag cannot be
    drawn (`banned`).
    """

    def __init__(self, model, policy: Policy, settings: SamplerSettings, eos: set[int], generator,
                 lane_cache: type[LaneCache] | None):
        self.model, self.policy, self.settings, self.eos, self.generator = model, policy, settings, eos, generator
        self.lane_cache = lane_cache
        self.tags = policy.tag_ids
        self.schema = self.tags.schema if self.tags else None
        self.tag_names = self.tags.names() if self.tags else {}  # token id -> tag role
        self.dtype = mask_dtype(model)
        self.window = sliding_window(model)  # a sliding window (Gemma-3): masks by layer type
        self.structured = policy.mode == "structured"  # fork and merge; causal decodes plainly
        self.draw = CallDraw(policy, settings.top_k, settings.top_p, generator)  # draw_in_place.py: `draw`, its buffer

    # --- the loop -------------------------------------------------------------------------
    def run(self, prompts: list[list[int]], samples_per_prompt: int) -> list[Rollout]:
        logits, banned, lanes = self.prefill(prompts, samples_per_prompt)
        while lanes:
            # the trainer's policy, nothing more: no repetition penalty (NPR's engine puts 1.02 on its step
            # branches; the recorded log-probs must be those GRPO's ratio reads, docs/recipes.md)
            tokens, logprobs = self.draw(logits, banned)  # softmax(logits / T), bans, one draw a lane
            drawn, chosen = self.read_back(tokens, logprobs)
            kept: list[tuple[int, _Lane]] = []  # (the cache row it keeps, the lane), for lanes that go on
            merged: list[tuple[Piece, _Lane]] = []  # (its new cache row, the lane), for blocks merged now
            for row, lane in enumerate(lanes):
                response = self.responses[lane.response]
                if response.finish:  # ended earlier in this step (budget spent by a sibling)
                    continue
                if lane.action == "fork":
                    kept += [(row, branch) for branch in self.fork(lane, response)]
                elif lane.action == "end_path":
                    block = response.block
                    after = self.end_path(lane, row, response)  # None while a sibling path is open
                    if after is not None and len(block.paths) == 1:  # its row already holds prefix ‖ path
                        kept.append((row, after))
                    elif after is not None:
                        merged.append((block.merged_row(), after))
                elif self.advance(lane, response, drawn[row], chosen[row]):
                    kept.append((row, lane))
            kept = [(row, lane) for row, lane in kept if not self.responses[lane.response].finish]
            merged = [(piece, lane) for piece, lane in merged if not self.responses[lane.response].finish]
            # The one place the KV cache is copied. `kept` names, lane by lane, the cache row it goes on
            # from: a fork lists its parent's row K times (the copy of the prefix), a finished lane is
            # not listed. `merged` brings one new row per block just closed, its pieces joined. Say
            # row 1 forked (K = 3) and row 2 closed the last path of a block whose pieces are p0 p1 p2:
            #
            #   rows before     kept            merged             rows after
            #   0: q a          [0, 1, 1, 1]    [p0 ‖ p1 ‖ p2]     0: q a    1, 2, 3: r P    4: p0 p1 p2
            #   1: r P
            #   2: s P A z /
            #
            # `LaneCache.rebuild` copies at once; the default at a real vocabulary, `LazyLaneCache`,
            # records the rows and builds them in the copy the next forward's append makes anyway.
            if len(kept) != len(lanes) or merged or any(source != row for row, (source, _) in enumerate(kept)):
                self.cache.rebuild([row for row, _ in kept], [piece for piece, _ in merged])
            lanes = [lane for _, lane in kept + merged]
            if lanes:
                logits, banned = self.forward(lanes)
        return [self.finish(r) for r in self.responses]

    def prefill(self, prompts, samples_per_prompt):
        """Read every prompt once (left-padded, causal), then duplicate each row G times."""
        device = self.model.device
        T = max(map(len, prompts))
        ids = torch.zeros(len(prompts), T, dtype=torch.long, device=device)
        real = torch.zeros(len(prompts), T, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            ids[row, T - len(prompt) :] = torch.tensor(prompt, device=device)
            real[row, T - len(prompt) :] = 1
        layout = build_layout(ids, self.tags, "causal", attention_mask=real, dtype=self.dtype, window=self.window)
        # With a window, a cache of plain layers: the model's own would keep only the last window - 1
        # columns of its sliding layers, and a lane's row holds every token it sees, in every layer.
        # The head reads the last position only, picked by index: `logits_to_keep=1` slices it as a
        # strided [B, 1, d] view, and torch's matmul of such a view by a frozen head (LoRA, a loaded
        # checkpoint) copies the head's weight once per row, a [B, d, V] tensor (docs/qwen.md, "Speed").
        last = torch.tensor([T - 1], device=device)
        out = self.model(
            input_ids=ids, attention_mask=layout.attention_mask, position_ids=layout.position_ids,
            cache=DynamicCache() if self.window else None, use_cache=True, logits_to_keep=last,
        )
        kind = self.lane_cache or cache_for_vocabulary(out.logits.shape[-1])
        self.cache = kind(out.cache, [len(p) for p in prompts], self.settings.longest_row(T))
        rows = [p for p in range(len(prompts)) for _ in range(samples_per_prompt)]
        if samples_per_prompt > 1:
            self.cache.rebuild(rows, [])
        self.peak_cache_bytes = self.cache.nbytes()
        self.responses = [_Response(prompts[p]) for p in rows]
        lanes = [
            _Lane(response=i, state="main", position=len(prompts[p]), pending=-1, out=self.responses[i].tokens)
            for i, p in enumerate(rows)
        ]
        if out.logits.shape[-1] > 2**24:
            raise NanoparError(f"the sampler reads token ids back as float32: at most 2^24 ids, not {out.logits.shape[-1]}")
        self.vocab_rows = out.logits.shape[-1]  # V: the width of `banned`
        bans = [self.ban(lane) for lane in lanes]
        return out.logits[rows, -1], self.banned(bans, torch.tensor(bans, device=device)[:, None]), lanes

    def forward(self, lanes: list[_Lane]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed every lane its pending token. -> (logits [N, V], the next draw's bans: `banned`)"""
        # what the step needs from the host, in one copy to the device (on a GPU each copy waits for the
        # device): per lane the token it is fed, its position, and the token its next draw may not take
        bans = [self.ban(lane) for lane in lanes]
        fed = torch.tensor([[[lane.pending] for lane in lanes], [[lane.position] for lane in lanes], [[b] for b in bans]],
                           device=self.model.device)  # [3, N, 1]
        tokens, positions, banned_ids = fed  # [N, 1] each
        out = self.model(
            input_ids=tokens, attention_mask=self.cache.step_mask(self.dtype, self.window), position_ids=positions,
            cache=self.cache.cache, use_cache=True,
        )
        self.cache.appended()
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache.nbytes())
        for lane in lanes:
            lane.position += 1
        return out.logits[:, -1], self.banned(bans, banned_ids)

    def read_back(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], list[float]]:
        """The drawn tokens [N] and their float32 log-probs [N] as Python lists, in one copy to the host:
        the one wait for the device a step makes (the bookkeeping needs the tokens). float32 holds
        every id below 2^24 exactly (`prefill` checks the vocabulary)."""
        drawn, chosen = torch.stack([tokens.float(), logprobs.float()]).tolist()  # [2, N]
        return [int(token) for token in drawn], chosen

    # --- one lane, one token ----------------------------------------------------------------
    def advance(self, lane: _Lane, response: _Response, drawn: int, logprob: float) -> bool:
        """Append the lane's next token (forced, or the drawn one) and act on it. False: lane ends."""
        if lane.forced:
            token, sampled = lane.forced.pop(0), False
            response.cut += self.tags is not None and token == self.tags.path_close
        else:
            if response.sampled >= self.settings.max_new_tokens:  # budget spent: the response ends here
                response.finish = "length"
                return False
            token, sampled = drawn, True
            response.sampled += 1
            lane.path_sampled += lane.state == "path"
        lane.out.add(token, sampled, logprob)
        lane.pending = token
        if token in self.eos and sampled:
            if lane.state != "path" or not self.structured:
                response.finish = "eos"
                return False
            lane.forced.append(self.tags.path_close)  # EOS ends the path
            return True
        role = self.tag_names.get(token)
        if role is not None:
            lane.state, structural = read_tag(lane.state, role, self.schema)
            if not structural:
                response.stray += 1
            elif self.structured and role == self.schema.fork_role:  # <Parallel>; NPR: </guideline>
                lane.action = "fork"
            elif self.structured and role == "path_close":
                lane.action = "end_path"
            elif role == "path_open":  # causal: a new path, its own length budget
                lane.path_sampled = 0
            if structural and role == "block_open":
                response.forks, response.plans = response.forks + 1, 0
            elif structural and role == "plan_close":  # NPR
                response.plans += 1
        if lane.state == "path" and lane.action is None and not lane.forced:
            if lane.path_sampled >= self.settings.max_path_tokens:
                lane.forced.append(self.tags.path_close)
        return True

    def fork(self, parent: _Lane, response: _Response) -> list[_Lane]:
        """The parent has just been fed the fork tag: K branches, each forced to open its path."""
        K = self.branch_count(response)
        response.block = _Block(start=parent.position, paths=[_Tokens() for _ in range(K)])
        branches = []
        for k in range(K):
            first, *rest = self.path_opening(k)
            branch = _Lane(response=parent.response, state=read_tag("block", "path_open", self.schema)[0],
                           position=path_start(parent.position, k, self.policy.path_stride),
                           pending=first, out=response.block.paths[k], path=k, forced=rest)
            branch.out.add(first, sampled=False)
            branches.append(branch)
        return branches

    def end_path(self, lane: _Lane, row: int, response: _Response) -> _Lane | None:
        """A branch has been fed its close tag: its block keeps its cache piece, and its row goes.
        -> the lane that continues after the block once every path is closed; None before."""
        block = response.block
        if len(block.paths) > 1:  # (one path: its row is already prefix ‖ path and simply goes on)
            block.keep_piece(lane.path, self.cache, row)
            if not block.closed:
                return None
        return self.merge(lane, response)

    def merge(self, last: _Lane, response: _Response) -> _Lane:
        """Every path is closed: one lane again, at the position after the block, fed the merge tags."""
        block = response.take_block()
        first, *rest = self.merge_tags()
        lane = _Lane(response=last.response, state=read_tag("block", self.schema.merge_roles[0], self.schema)[0],
                     position=after_block(block.start, [len(p.ids) for p in block.paths], self.policy.path_stride),
                     pending=first, out=response.tokens, forced=rest)
        response.tokens.add(first, sampled=False)
        return lane

    # --- where NPR's schema differs ----------------------------------------------------------
    def branch_count(self, response: _Response) -> int:
        """K: `paths` (Parallel-R1), or NPR's one branch per plan just written (>= 1: `plan_bans`)."""
        return response.plans if self.schema.planned else self.settings.paths

    def path_opening(self, k: int) -> list[int]:
        """What branch k is forced to write first: <Path>; NPR: <step> and its label "k+1:".
        Simpler than NPR's engine, which opens a branch with a newline, <step>, a newline and the
        number its plan wrote ("1.2:" too)."""
        return [self.tags.path_open, *(self.tags.labels[k] if self.tags.labels else ())]

    def merge_tags(self) -> list[int]:
        """What the merged lane is fed: </Parallel> <Summary>; NPR: <takeaway>."""
        return [getattr(self.tags, role) for role in self.schema.merge_roles]

    def plan_bans(self, response: _Response) -> list[int]:
        """NPR, in a guideline: a plan beyond `paths`, or </guideline> before the first plan (the
        engine forks one branch per plan). Simpler than NPR's engine, which lets the model write
        them and ends the response at a </guideline> after no plan or more than 5 (`check_finished`
        in npr-rl/verl/workers/rollout/sglang_rollout/sglang/python/sglang/srt/managers/
        schedule_batch.py): a ban, as `max_blocks` bans the block tag, spends no rollout on a
        response a structural limit ended (docs/recipes.md, "Simplifications")."""
        if response.plans >= self.settings.paths:
            return [self.tags.plan_open]
        return [self.tags.plans_close] if response.plans == 0 else []

    # --- budgets ------------------------------------------------------------------------------
    def ban(self, lane: _Lane) -> int:
        """The tag that would break a budget or the schema where the lane stands (-1: none): the block
        tag in the main chain once `max_blocks` blocks are open ("after": between </Parallel> and
        <Summary>, where <Parallel> would open a block too), or NPR's `plan_bans` (one at most)."""
        response = self.responses[lane.response]
        if self.tags is None:
            return -1
        if lane.state in ("main", "after") and response.forks >= self.settings.max_blocks:
            return self.tags.block_open
        bans = self.plan_bans(response) if lane.state == "plans" else []
        return bans[0] if bans else -1

    def banned(self, bans: list[int], ids: torch.Tensor) -> torch.Tensor | None:
        """The draw's bans: `bans` per lane (`ban`), `ids` [N, 1] the same on the device -> [N, V]
        bool, None when no lane has one."""
        if max(bans) < 0:
            return None
        banned = torch.zeros(len(bans), self.vocab_rows, dtype=torch.bool, device=ids.device)  # [N, V]
        return banned.scatter_(1, ids.clamp(min=0), ids >= 0)  # (a lane without a ban writes False)

    def finish(self, response: _Response) -> Rollout:
        """Write out a block still in flight (budget spent: its open paths closed), then the rollout."""
        if response.block is not None:
            for path in response.block.paths:
                if path.ids[-1] != self.tags.path_close:
                    path.add(self.tags.path_close, sampled=False)
                    response.cut += 1
            response.take_block()
        tokens = response.tokens
        trace = parse_ids(tokens.ids, self.tags)
        # one entry per fork in both modes. Structured: as the branches were built, and [] for the
        # guideline (NPR) the response ended in before </guideline>, as the reader has it; causal: as read
        if self.structured:
            path_lengths = response.path_lengths + [[]] * (response.forks - len(response.path_lengths))
        else:
            path_lengths = [[len(p) for p in b.paths] for b in trace.blocks]
        stats = RolloutStats(
            new_tokens=len(tokens.ids), sampled_tokens=response.sampled, forks=response.forks,
            path_lengths=path_lengths, critical_path=trace_stats(trace).critical_path,
            stray_tags=response.stray, cut_paths=response.cut, wall_time=0.0, peak_cache_bytes=0,
        )
        return Rollout(response.prompt, tokens.ids, tokens.sampled, tokens.logprobs, trace,
                       response.finish or "length", stats)
