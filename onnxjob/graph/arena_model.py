"""What onnxruntime's arena reserves for a step's intermediates, from its memory plan.

graph/memory_plan.py counts the bytes live together (the peak a perfect packing needs).
A session gets its buffers from onnxruntime's BFC arena (core/framework/bfc_arena.cc), which
can hold more: it grows by regions that never merge, picks the smallest free chunk that
fits (best fit over power-of-two bins), splits a chunk only when it is at least twice the
request or the rest is at least `max_dead_bytes_per_chunk` (128 MiB by default), and
merges a freed chunk only with free neighbours of its own region. Before the arena,
onnxruntime's allocation planner (core/framework/allocation_planner.cc) hands some outputs
a buffer that is already there: an elementwise node may write over an input that dies
there (`MayInplace`), and an output may take a buffer of exactly its size whose value died
earlier (the free list, most recently freed first); such a buffer stays held from its first
value's birth to its last value's death.

`replay(plan)` runs the plan's buffers through that planner and arena, in the plan's order
(a node's outputs are allocated before it runs, what it read last is freed after), and
reports the bytes the arena reserved (its regions), next to the plan's peak. It is a
model: it knows the tensors of the graph, not the scratch memory kernels ask for while they
run (cuDNN and cuBLAS workspaces), and it takes the planner's choices as described above.
bench/arena_model.py prints it for a job compiled for CUDA.
"""
import bisect
import dataclasses

MIN_ALLOCATION = 256                # kMinAllocationSize: every chunk is a multiple of it
BINS = 21                           # kNumBins: bin b holds chunks of 256 * 2**b bytes and up
MAX_DEAD_BYTES = 128 << 20          # max_dead_bytes_per_chunk's default
INITIAL_CHUNK = 1 << 20             # initial_chunk_size_bytes' default (kNextPowerOfTwo)
STRATEGIES = ("kSameAsRequested", "kNextPowerOfTwo")
# ops whose CUDA kernels let onnxruntime's planner write the output over input 0
# (KernelDefBuilder::MayInplace(0, 0)): unary and binary elementwise ops
IN_PLACE_OPS = frozenset({
    "Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
    "Add", "Sub", "Mul", "Div", "Pow", "LeakyRelu", "Elu", "Cast", "Where", "Clip"})


@dataclasses.dataclass
class ArenaRun:
    """What `replay` found (bytes)."""
    strategy: str
    reserved_bytes: int         # the arena's regions at the end (it never gives them back)
    peak_in_use_bytes: int      # the largest sum of chunks handed out at once
    regions: int                # how many times the arena grew
    planner_reused: int         # outputs the planner gave an existing buffer


def rounded(nbytes):
    return -(-max(nbytes, 1) // MIN_ALLOCATION) * MIN_ALLOCATION


def _bin(size):
    return min(max(size // MIN_ALLOCATION, 1).bit_length() - 1, BINS - 1)


class Arena:
    """onnxruntime's BFCArena for one stream: `alloc(n)` -> chunk id, `free(chunk)`."""

    def __init__(self, strategy="kSameAsRequested", max_dead_bytes=MAX_DEAD_BYTES,
                 initial_chunk=INITIAL_CHUNK):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy, self.max_dead = strategy, max_dead_bytes
        self.next_region = rounded(initial_chunk)
        self.size, self.prev, self.next, self.used = {}, {}, {}, {}
        self.address = {}           # chunk -> (region, offset): free chunks sort by size, then it
        self.bins = [[] for _ in range(BINS)]   # sorted [(size, address, chunk)]
        self.reserved = self.in_use = self.peak_in_use = self.regions = 0
        self._ids = 0

    def _chunk(self, size, address, prev=None, nxt=None):
        self._ids += 1
        c = self._ids
        self.size[c], self.address[c], self.prev[c], self.next[c] = size, address, prev, nxt
        self.used[c] = False
        return c

    def _insert(self, c):
        bisect.insort(self.bins[_bin(self.size[c])], (self.size[c], self.address[c], c))

    def _remove(self, c):
        entries = self.bins[_bin(self.size[c])]
        entries.pop(bisect.bisect_left(entries, (self.size[c], self.address[c], c)))

    def _find(self, nbytes):
        for b in range(_bin(nbytes), BINS):
            entries = self.bins[b]
            k = bisect.bisect_left(entries, (nbytes, (-1, -1), -1))
            if k < len(entries):
                return entries[k][2]
        return None

    def _extend(self, nbytes):
        if self.strategy == "kSameAsRequested":
            grow = nbytes
        else:
            increased = False
            while nbytes > self.next_region:
                self.next_region *= 2
                increased = True
            grow = self.next_region
            if not increased:
                self.next_region *= 2
        self.regions += 1
        self.reserved += grow
        self._insert(self._chunk(grow, (self.regions, 0)))

    def alloc(self, nbytes):
        nbytes = rounded(nbytes)
        c = self._find(nbytes)
        if c is None:
            self._extend(nbytes)
            c = self._find(nbytes)
        self._remove(c)
        if self.size[c] >= 2 * nbytes or self.size[c] - nbytes >= self.max_dead:
            region, offset = self.address[c]
            rest = self._chunk(self.size[c] - nbytes, (region, offset + nbytes), c, self.next[c])
            if self.next[c] is not None:
                self.prev[self.next[c]] = rest
            self.next[c], self.size[c] = rest, nbytes
            self._insert(rest)
        self.used[c] = True
        self.in_use += self.size[c]
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return c

    def free(self, c):
        self.used[c] = False
        self.in_use -= self.size[c]
        nxt = self.next[c]
        if nxt is not None and not self.used[nxt]:
            self._remove(nxt)
            self._merge(c, nxt)
        prev = self.prev[c]
        if prev is not None and not self.used[prev]:
            self._remove(prev)
            self._merge(prev, c)
            c = prev
        self._insert(c)

    def _merge(self, first, second):
        self.size[first] += self.size[second]
        self.next[first] = self.next[second]
        if self.next[second] is not None:
            self.prev[self.next[second]] = first
        for table in (self.size, self.prev, self.next, self.used, self.address):
            del table[second]


def replay(plan, strategy="kSameAsRequested", planner_reuse=True,
           max_dead_bytes=MAX_DEAD_BYTES, initial_chunk=INITIAL_CHUNK, reserved_first=0):
    """The ArenaRun of one step of `plan` (a graph/memory_plan.MemoryPlan): its
    intermediates through onnxruntime's planner (`planner_reuse`) and BFC arena.
    `reserved_first`: bytes of one region the arena made (and freed) before the step."""
    chains, reused = planner_chains(plan) if planner_reuse else (
        [(start, end, nbytes) for start, end, nbytes in plan.lifetimes.values()], 0)
    arena = _run(chains, Arena(strategy, max_dead_bytes, initial_chunk), reserved_first)
    return ArenaRun(strategy, arena.reserved, arena.peak_in_use, arena.regions, reused)


def reserved_after_regions(plan, sizes):
    """{size: bytes onnxjob's arena (kSameAsRequested) reserves for `plan`'s step after a
    first region of `size` bytes (0: none)}, as `replay` gives them (the planner's choices
    made once for all sizes)."""
    chains, _ = planner_chains(plan)
    return {n: _run(chains, Arena(), n).reserved for n in sizes}


def _run(chains, arena, reserved_first):
    """`arena` after the buffers `chains` [(first position, last position, bytes)] were
    allocated and freed in position order, after one region of `reserved_first` bytes."""
    made_at, dies_at = {}, {}
    for k, (start, end, _) in enumerate(chains):
        made_at.setdefault(start, []).append(k)
        dies_at.setdefault(end, []).append(k)
    if reserved_first:
        arena.free(arena.alloc(reserved_first))
    chunk = {}
    for i in sorted(set(made_at) | set(dies_at)):
        for k in made_at.get(i, ()):
            chunk[k] = arena.alloc(chains[k][2])
        for k in dies_at.get(i, ()):
            arena.free(chunk.pop(k))
    return arena


def planner_chains(plan):
    """([(first position, last position, bytes)] of the buffers onnxruntime's planner asks
    the arena for, how many outputs it gave an existing buffer instead): an output takes
    input 0's buffer when its op may write in place and input 0's last reader is this node,
    else the most recently freed buffer of exactly its size, else a new one. A buffer is
    held until the last value given it dies."""
    chains, chain_of = [], {}
    pending = {}            # chain -> its values not dead yet
    free_list = []          # chains whose values all died, most recently freed last
    dies_at = {}
    for buf, (_, end, _) in plan.lifetimes.items():
        dies_at.setdefault(end, []).append(buf)
    made_at = {}
    for buf, (start, _, _) in plan.lifetimes.items():
        made_at.setdefault(start, []).append(buf)
    reused = 0
    for i, node in enumerate(plan.order):
        for buf in made_at.get(i, ()):
            _, end, nbytes = plan.lifetimes[buf]
            k = _in_place_chain(plan, node, i, nbytes, chain_of, chains, pending)
            if k is None:
                same = [j for j in range(len(free_list) - 1, -1, -1)
                        if chains[free_list[j]][2] == nbytes]
                k = free_list.pop(same[0]) if same else None
            if k is None:
                chains.append([i, end, nbytes])
                k = len(chains) - 1
            else:
                reused += 1
                chains[k][1] = max(chains[k][1], end)
            chain_of[buf] = k
            pending[k] = pending.get(k, 0) + 1
        for buf in dies_at.get(i, ()):
            k = chain_of[buf]
            pending[k] -= 1
            if pending[k] == 0:
                free_list.append(k)
    return [tuple(c) for c in chains], reused


def _in_place_chain(plan, node, i, nbytes, chain_of, chains, pending):
    """The chain of `node`'s input 0 when the output may be written over it (see
    planner_chains), else None."""
    if node.op_type not in IN_PLACE_OPS or not node.inputs or node.inputs[0] is None:
        return None
    source = plan.buffer_of.get(id(node.inputs[0]))
    if source not in chain_of or plan.lifetimes[source][1] != i or \
            plan.lifetimes[source][2] != nbytes:
        return None
    k = chain_of[source]
    return k if pending.get(k) == 1 else None
