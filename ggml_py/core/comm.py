"""What the ALL_REDUCE op needs to call MPI from C: MPI_Allreduce's address in the MPI
library mpi4py has loaded, and the handles it takes (the communicator, MPI_FLOAT, MPI_SUM,
MPI_IN_PLACE), packed into the node's op_params (struct ggml_py_comm, include/ggml_py.h).

ggml_py is built without MPI: the function is found at run time through mpi4py's own
extension module, whose dependencies include the MPI library it was loaded with, so the
op calls the very library (and ABI) that mpi4py uses. mpi4py is imported only here, and
only when a communicator is given (it is then loaded already).
"""
import ctypes
import struct

COMM_FIELDS = "<qqqqqii"     # struct ggml_py_comm: five int64, handle_bytes, last_error
_allreduce_address = None


def _mpi():
    from mpi4py import MPI  # only with a communicator in hand: already imported
    return MPI


def is_communicator(obj):
    """Whether obj is an mpi4py intracommunicator (without importing mpi4py when it
    has not been: nothing else can be one)."""
    import sys
    if "mpi4py.MPI" not in sys.modules:
        return False
    return isinstance(obj, sys.modules["mpi4py.MPI"].Intracomm)


def _handle(MPI, obj):
    """The C handle of an mpi4py object, as an integer (an int or a pointer's address)."""
    handle = getattr(obj, "handle", None)      # mpi4py 4
    return int(handle) if handle is not None else int(MPI._handleof(obj))


def allreduce_address():
    """The address of MPI_Allreduce in the MPI library mpi4py uses."""
    global _allreduce_address
    if _allreduce_address is None:
        MPI = _mpi()
        # dlsym on mpi4py's module handle searches its dependencies: its libmpi
        lib = ctypes.CDLL(MPI.__file__)
        _allreduce_address = ctypes.cast(lib.MPI_Allreduce, ctypes.c_void_p).value
    return _allreduce_address


def comm_params(comm):
    """op_params (int32 values) of an ALL_REDUCE over mpi4py communicator `comm`.

    TypeError for anything but an mpi4py intracommunicator; ValueError for MPI.COMM_NULL.
    """
    if not is_communicator(comm):
        raise TypeError(f"all_reduce: comm must be an mpi4py communicator (such as "
                        f"MPI.COMM_WORLD), got {type(comm).__name__}")
    MPI = _mpi()
    if comm == MPI.COMM_NULL:
        raise ValueError("all_reduce: comm is MPI.COMM_NULL")
    handle_bytes = MPI._sizeof(MPI.Comm)
    if handle_bytes not in (4, 8) or MPI._sizeof(MPI.Datatype) != handle_bytes \
            or MPI._sizeof(MPI.Op) != handle_bytes:
        raise ValueError(f"all_reduce: this MPI library's handles are "
                         f"{handle_bytes} bytes; ggml_py calls MPI with handles of 4 or 8")
    raw = struct.pack(COMM_FIELDS, allreduce_address(), _handle(MPI, comm),
                      _handle(MPI, MPI.FLOAT), _handle(MPI, MPI.SUM), int(MPI.IN_PLACE),
                      handle_bytes, 0)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))
