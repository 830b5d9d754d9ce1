# _core_tensors.pxi: the arena, tensor structs and their task profiles. Part of _core.pyx (textually included there):
# it shares that module's cimports and names.

# ---------------------------------------------------------------------------
# the arena

cdef class Context:
    """An arena that owns tensor structs and tensor data (one aligned numpy buffer)."""
    cdef readonly object buffer
    cdef readonly size_t mem_size
    cdef readonly size_t used
    cdef uintptr_t base

    def __cinit__(self, mem_size=16 << 20):
        # in __cinit__, not __init__: a second __init__ call must not swap the arena
        # under the tensor structs that live in it
        try:
            mem_size = operator.index(mem_size)    # not a float to truncate
        except TypeError:
            raise TypeError(f"Context: mem_size must be an integer, got {mem_size!r:.40}") from None
        if mem_size < 0:
            raise ValueError(f"Context: mem_size must be >= 0, got {mem_size}")
        try:
            raw = np.zeros(mem_size + ARENA_ALIGN, dtype=np.uint8)
        except (MemoryError, ValueError, OverflowError):   # numpy: "array is too big"
            raise MemoryError(f"Context: cannot allocate an arena of mem_size={mem_size} bytes "
                              f"({mem_size / 2**30:.1f} GiB)") from None
        start = (-raw.ctypes.data) % ARENA_ALIGN
        self.buffer = raw[start:start + mem_size]
        self.base = self.buffer.ctypes.data
        self.mem_size = mem_size
        self.used = 0

    cdef uintptr_t alloc(self, size_t nbytes) except 0:
        cdef size_t start = (self.used + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
        if start + nbytes > self.mem_size:
            raise MemoryError(
                f"Context out of memory: needs {start + nbytes} bytes, has {self.mem_size} "
                f"(create it with a larger mem_size)")
        self.used = start + nbytes
        return self.base + start

    def __repr__(self):
        return f"Context(mem_size={self.mem_size}, used={self.used})"

    def __reduce_ex__(self, protocol):   # copy, deepcopy and pickle all come here
        _refuse_copy(self)


# ---------------------------------------------------------------------------
# tensors

_MAKE = object()   # new_tensor's pass: a TensorBase is never made without a struct


cdef class TensorBase:
    """A ggml_py_tensor struct living in a Context, plus what keeps its memory alive."""
    cdef ggml_py_tensor *t
    cdef readonly Context ctx
    cdef readonly tuple src          # source tensors (Python references)
    cdef readonly object owner       # numpy array whose memory holds the data
    cdef readonly uintptr_t owner_base
    cdef readonly int ndim
    cdef readonly bint read_only     # data is a read-only buffer: never a write's destination
    cdef readonly object rows8       # numpy array behind t.rows8 (None: no interleaved copy)
    cdef int n_computing             # computes running over this node (its profile is then fixed)

    def __cinit__(self, *args, **kwargs):
        if len(args) != 1 or args[0] is not _MAKE or kwargs:
            raise TypeError(f"{type(self).__name__} cannot be created directly: tensors come "
                            f"from a Context (new_tensor, from_numpy, from_buffer) or an op")

    def __reduce_ex__(self, protocol):   # copy, deepcopy and pickle all come here
        _refuse_copy(self)

    @property
    def _type(self):
        return self.t.type

    @property
    def _op(self):
        return self.t.op

    @property
    def _ne(self):
        return (self.t.ne[0], self.t.ne[1], self.t.ne[2], self.t.ne[3])

    @property
    def _nb(self):
        return (self.t.nb[0], self.t.nb[1], self.t.nb[2], self.t.nb[3])

    def _set_rows8(self, object buffer):
        """t.rows8 = buffer's memory (kept alive here): the caller has checked it."""
        self.t.rows8 = <const void *> (<uintptr_t> buffer.ctypes.data)
        self.rows8 = buffer

    @property
    def data_ptr(self):
        """Address of the first element."""
        return <uintptr_t> self.t.data

    @property
    def nbytes(self):
        """Bytes spanned by the data (strides included)."""
        return ggml_py_nbytes(self.t)

    @property
    def is_contiguous(self):
        """True when rows are packed with no gaps, in ggml order."""
        return ggml_py_is_contiguous(self.t)

    @property
    def name(self):
        return self.t.name.decode("utf-8", "replace")

    @name.setter
    def name(self, value):
        # cut on a character boundary: a split character would not decode
        cdef bytes raw = _utf8_prefix(str(value), GGML_PY_MAX_NAME - 1)
        memset(self.t.name, 0, GGML_PY_MAX_NAME)
        memcpy(self.t.name, <char *> raw, len(raw))

    def _profile_raw(self):
        return _profile_to_tuple(&self.t.profile)

    def _set_profile_raw(self, int32_t id, str name, stages):
        if self.n_computing:
            # the running compute sized its work buffer for the profile it started with
            raise RuntimeError(f"profile: this {_OP_NAMES.get(self.t.op, '?')} node is being "
                               f"computed (by another thread, or around this signal handler); "
                               f"set its profile before or after the compute")
        _profile_from_tuple(&self.t.profile, id, name, stages)

    def _op_param_i32(self, int i):
        if not 0 <= i < GGML_PY_MAX_OP_PARAMS:
            raise IndexError(f"op param {i}: there are {GGML_PY_MAX_OP_PARAMS}")
        return self.t.op_params[i]

    def _set_op_param_i32(self, int i, int32_t value):
        if not 0 <= i < GGML_PY_MAX_OP_PARAMS:
            raise IndexError(f"op param {i}: there are {GGML_PY_MAX_OP_PARAMS}")
        if self.n_computing:
            raise RuntimeError("op params: this node is being computed")
        self.t.op_params[i] = value

    def _default_profile_raw(self):
        cdef ggml_py_task_profile p = ggml_py_default_profile(self.t)
        return _profile_to_tuple(&p)

    def _op_profiles_raw(self):
        cdef ggml_py_task_profile out[GGML_PY_MAX_PROFILES]
        cdef int n = ggml_py_op_profiles(self.t, out)
        return [_profile_to_tuple(&out[i]) for i in range(n)]

    def _work_size(self, int n_threads):
        return ggml_py_node_work_size(self.t, n_threads)


cdef tuple _profile_to_tuple(const ggml_py_task_profile *p):
    return (p.id, (<const char *> p.name).decode("utf-8", "replace"),
            tuple((bool(p.stages[s].valid), bool(p.stages[s].parallel), bool(p.stages[s].wait))
                  for s in range(GGML_PY_N_STAGES)))


cdef void _profile_from_tuple(ggml_py_task_profile *p, int32_t id, str name, stages) except *:
    cdef bytes raw = _utf8_prefix(name, sizeof(p.name) - 1)
    memset(p, 0, sizeof(ggml_py_task_profile))
    p.id = id
    memcpy(p.name, <char *> raw, len(raw))
    for s, (valid, parallel, wait) in enumerate(stages):
        p.stages[s].valid = valid
        p.stages[s].parallel = parallel
        p.stages[s].wait = wait


def new_tensor(cls, Context ctx, int type, ne, nb, int ndim, int op=0, tuple src=(),
               op_params=None, TensorBase view_of=None, size_t view_offset=0,
               object external=None):
    """Create a `cls` (a TensorBase subclass) with a fresh struct in ctx.

    Data: a view of `view_of` at `view_offset` bytes, or `external` (a numpy
    array whose memory is used in place), or fresh zeroed arena memory.
    ne, nb: 4 ints each, ggml order (nb may be None for contiguous).
    Sizes are checked as exact ints before they reach C: ValueError when the
    element count or a byte size does not fit in int64, MemoryError when the
    arena is too small.
    """
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    ne = tuple(operator.index(n) for n in ne)
    if len(ne) != GGML_PY_MAX_DIMS or any(n < 0 for n in ne):
        raise ValueError(f"ne must be {GGML_PY_MAX_DIMS} sizes >= 0, got {ne}")
    if ne[0] % tt.blck_size:
        raise ValueError(f"a row of {tt.name.decode()} needs a multiple of {tt.blck_size} "
                         f"elements, got {ne[0]}")
    if max(ne) > INT64_MAX or math.prod(ne) > INT64_MAX:   # one size alone, with a 0 beside it
        raise ValueError(f"a tensor of ne {ne} has more elements than int64 can count")
    if nb is None:
        nb = (tt.type_size, tt.type_size * (ne[0] // tt.blck_size))
        nb += (nb[1] * ne[1], nb[1] * ne[1] * ne[2])
    nb = tuple(operator.index(n) for n in nb)
    if len(nb) != GGML_PY_MAX_DIMS or any(n < 0 for n in nb):
        raise ValueError(f"nb must be {GGML_PY_MAX_DIMS} strides >= 0, got {nb}")
    # as ggml_py_nbytes counts: the first byte to the end of the last element
    if 0 in ne:
        nbytes = 0
    elif tt.blck_size == 1:
        nbytes = tt.type_size + sum((ne[i] - 1) * nb[i] for i in range(GGML_PY_MAX_DIMS))
    else:
        nbytes = (ne[0] // tt.blck_size) * nb[0] + sum((ne[i] - 1) * nb[i]
                                                       for i in range(1, GGML_PY_MAX_DIMS))
    if max(nb) > INT64_MAX:
        raise ValueError(f"a stride of nb {nb} is more bytes than int64 can count")
    if nbytes > INT64_MAX:
        raise ValueError(f"a {tt.name.decode()} tensor of ne {ne} needs {nbytes} bytes, more "
                         f"than int64 can count")
    cdef TensorBase tensor = cls.__new__(cls, _MAKE)
    cdef ggml_py_tensor *t = <ggml_py_tensor *> ctx.alloc(sizeof(ggml_py_tensor))
    memset(t, 0, sizeof(ggml_py_tensor))
    t.type = type
    t.op = op
    for i in range(GGML_PY_MAX_DIMS):
        t.ne[i] = ne[i]
        t.nb[i] = nb[i]
    if op_params is not None:
        for i, v in enumerate(op_params):
            t.op_params[i] = v
    for i, s in enumerate(src):
        if s is not None:
            t.src[i] = (<TensorBase> s).t

    tensor.t = t
    tensor.ctx = ctx
    tensor.src = src
    tensor.ndim = ndim
    if view_of is not None:
        t.data = <void *> ((<uintptr_t> view_of.t.data) + view_offset)
        tensor.owner = view_of.owner
        tensor.owner_base = view_of.owner_base
        tensor.read_only = view_of.read_only
    elif external is not None:
        t.data = <void *> (<uintptr_t> external.ctypes.data)
        tensor.owner = external
        tensor.owner_base = external.ctypes.data
        tensor.read_only = not external.flags.writeable
    else:
        t.data = <void *> ctx.alloc(nbytes)
        tensor.owner = ctx.buffer
        tensor.owner_base = ctx.base
    t.profile = ggml_py_default_profile(t)
    return tensor


cdef void _set_contiguous_strides(ggml_py_tensor *t):
    """nb of a packed tensor of t.type and t.ne (ggml's layout)."""
    cdef const ggml_py_type_traits *tt = ggml_py_get_type_traits(t.type)
    t.nb[0] = tt.type_size
    t.nb[1] = tt.type_size * (t.ne[0] // tt.blck_size)
    for i in range(2, 4):
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1]


def op_profiles_for(int op, int type0, int type1, ne0=(1, 1, 1, 1), ne1=(1, 1, 1, 1)):
    """The profiles of `op` for sources of these types (default first)."""
    cdef ggml_py_tensor node, a, b
    cdef ggml_py_task_profile out[GGML_PY_MAX_PROFILES]
    _traits_or_raise(type0)
    _traits_or_raise(type1)
    memset(&node, 0, sizeof(node))
    memset(&a, 0, sizeof(a))
    memset(&b, 0, sizeof(b))
    node.op = op
    node.type = 0
    a.type = type0
    b.type = type1
    for i in range(4):
        a.ne[i] = ne0[i]
        b.ne[i] = ne1[i]
    _set_contiguous_strides(&a)
    _set_contiguous_strides(&b)
    node.src[0] = &a
    node.src[1] = &b
    cdef int n = ggml_py_op_profiles(&node, out)
    return [_profile_to_tuple(&out[i]) for i in range(n)]
