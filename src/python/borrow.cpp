// Borrowing a Python object's memory, zero copy: DLPack (PyTorch, CuPy, JAX,
// NumPy), __cuda_array_interface__ and the buffer protocol. What a protocol
// lent is held for the region's whole life; a non-contiguous object is
// refused, never copied.
#include "binding.hpp"
#include "dlpack.hpp"

#include <cstdint>
#include <numeric>
#include <string>

namespace gpuverbs::python {

namespace {

std::string type_name(const py::handle& obj) {
    return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

/// Holds a Python object from C++ (releases it under the GIL, from any thread).
std::shared_ptr<void> hold_object(const py::object& obj) {
    auto* held = new py::object(obj); // NOLINT(cppcoreguidelines-owning-memory): owned by the shared_ptr
    return {held, [](void* p) {
                py::gil_scoped_acquire gil;
                delete static_cast<py::object*>(p);
            }};
}

/// Whether `strides` (in units) describe compact row-major storage of `shape`.
bool row_major(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides, std::int64_t unit) {
    std::int64_t expected = unit;
    for (std::size_t i = shape.size(); i-- > 0;) {
        if (shape[i] != 1 && strides[i] != expected) return false;
        expected *= shape[i];
    }
    return true;
}

std::string dims(const std::vector<std::int64_t>& v) {
    std::string s = "(";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + (v.size() == 1 ? ",)" : ")");
}

[[noreturn]] void not_contiguous(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                                 const char* unit) {
    throw py::value_error("register: obj is not contiguous (shape " + dims(shape) + ", strides " + dims(strides) + " " +
                          unit +
                          "): the NIC reads one range of bytes and gpuverbs never copies; pass a contiguous tensor "
                          "(tensor.contiguous(), numpy.ascontiguousarray) and keep that one");
}

Borrowed from_dlpack(const py::object& obj) {
    py::object capsule = obj.attr("__dlpack__")();
    auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed == nullptr) {
        PyErr_Clear();
        throw py::type_error("register: obj.__dlpack__() did not return a \"dltensor\" capsule (got " +
                             type_name(capsule) + ")");
    }
    // Consumed: we call its deleter when the region goes (DLPack's rule).
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    Borrowed b;
    b.via = "dlpack";
    b.hold = std::shared_ptr<void>(managed, [](void* p) {
        auto* m = static_cast<dlpack::ManagedTensor*>(p);
        if (m->deleter != nullptr) {
            py::gil_scoped_acquire gil;
            m->deleter(m);
        }
    });
    const dlpack::Tensor& t = managed->dl_tensor;
    std::vector<std::int64_t> shape(t.shape,
                                    t.shape + t.ndim); // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
    std::int64_t elements = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (t.strides != nullptr) {
        std::vector<std::int64_t> strides(
            t.strides, t.strides + t.ndim); // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
        if (elements > 0 && !row_major(shape, strides, 1)) not_contiguous(shape, strides, "elements");
    }
    const std::size_t bits = std::size_t{t.dtype.bits} * t.dtype.lanes;
    if (bits % 8 != 0)
        throw py::value_error("register: obj's elements are " + std::to_string(bits) +
                              " bits wide: "
                              "only whole bytes can be registered");
    b.size = static_cast<std::size_t>(elements) * bits / 8;
    b.address = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
    switch (t.device.device_type) {
        case dlpack::cpu: b.device = "cpu"; break;
        case dlpack::cuda_host: b.device = "cuda_host"; break;
        case dlpack::cuda:
            b.cuda = true;
            b.gpu = t.device.device_id;
            b.device = "cuda:" + std::to_string(b.gpu);
            break;
        case dlpack::cuda_managed:
            throw py::value_error(
                "register: obj is in CUDA managed memory, which GPUDirect RDMA cannot reach: "
                "allocate it as device memory (or host memory)");
        default:
            throw py::value_error("register: obj is on DLPack device type " + std::to_string(t.device.device_type) +
                                  ": gpuverbs registers CPU and CUDA memory only");
    }
    return b;
}

Borrowed from_cuda_array_interface(const py::object& obj) {
    py::dict cai = obj.attr("__cuda_array_interface__");
    Borrowed b;
    b.via = "cuda_array_interface";
    b.cuda = true;
    b.gpu = -1; // the driver says (GpuMemory::from_address)
    b.device = "cuda";
    py::tuple data = cai["data"];
    b.address = data[0].cast<std::uint64_t>();
    b.readonly = data[1].cast<bool>();
    std::vector<std::int64_t> shape = cai["shape"].cast<std::vector<std::int64_t>>();
    std::string typestr = cai["typestr"].cast<std::string>();
    std::int64_t itemsize = typestr.size() > 2 ? std::stoll(typestr.substr(2)) : 0;
    if (itemsize <= 0)
        throw py::value_error("register: obj's __cuda_array_interface__ typestr '" + typestr + "' has no item size");
    std::int64_t elements = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (cai.contains("strides") && !cai["strides"].is_none()) {
        std::vector<std::int64_t> strides = cai["strides"].cast<std::vector<std::int64_t>>();
        if (elements > 0 && !row_major(shape, strides, itemsize)) not_contiguous(shape, strides, "bytes");
    }
    b.size = static_cast<std::size_t>(elements * itemsize);
    b.hold = hold_object(obj);
    return b;
}

Borrowed from_buffer(const py::object& obj, bool writable) {
    auto view =
        std::shared_ptr<Py_buffer>(new Py_buffer{}, [](Py_buffer* v) { // NOLINT(cppcoreguidelines-owning-memory)
            if (v->obj != nullptr) {
                py::gil_scoped_acquire gil;
                PyBuffer_Release(v);
            }
            delete v; // NOLINT(cppcoreguidelines-owning-memory)
        });
    const int flags = PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
        PyErr_Clear();
        if (writable && PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_STRIDES) == 0) {
            throw py::value_error("register: obj (" + type_name(obj) +
                                  ") is read-only, but access lets the NIC write into it (local_write, remote_write "
                                  "or remote_atomic): register a writable object, or ask for remote_read only");
        }
        PyErr_Clear();
        throw py::value_error("register: obj (" + type_name(obj) + ") refused the buffer protocol");
    }
    if (PyBuffer_IsContiguous(view.get(), 'C') == 0) {
        std::vector<std::int64_t> shape(view->shape, view->shape + view->ndim);       // NOLINT
        std::vector<std::int64_t> strides(view->strides, view->strides + view->ndim); // NOLINT
        not_contiguous(shape, strides, "bytes");
    }
    Borrowed b;
    b.via = "buffer";
    b.device = "cpu";
    b.address = reinterpret_cast<std::uintptr_t>(view->buf);
    b.size = static_cast<std::size_t>(view->len);
    b.readonly = view->readonly != 0;
    b.hold = view;
    return b;
}

bool dlpack_refused(const py::error_already_set& e) {
    return e.matches(PyExc_BufferError);
}

} // namespace

void check_size(std::size_t size) {
    if (size == 0) throw py::value_error("register: obj is empty (0 bytes): there is nothing to register");
}

Borrowed borrow(const py::object& obj, const std::string& via, bool writable) {
    const bool automatic = via == "auto";
    if (!automatic && via != "dlpack" && via != "cuda_array_interface" && via != "buffer") {
        throw py::value_error("register: via must be 'auto', 'dlpack', 'cuda_array_interface' or 'buffer', not '" +
                              via + "'");
    }
    if (via == "dlpack" || (automatic && py::hasattr(obj, "__dlpack__"))) {
        if (!py::hasattr(obj, "__dlpack__")) {
            throw py::type_error("register: obj (" + type_name(obj) + ") has no __dlpack__");
        }
        try {
            return from_dlpack(obj);
        } catch (py::error_already_set& e) {
            // NumPy refuses read-only arrays through DLPack: the buffer protocol takes them.
            if (!(automatic && dlpack_refused(e) && PyObject_CheckBuffer(obj.ptr()) != 0)) {
                if (e.matches(PyExc_TypeError) || e.matches(PyExc_ValueError)) throw;
                throw py::value_error("register: obj.__dlpack__() failed: " + std::string(e.what()));
            }
        }
    }
    if (via == "cuda_array_interface" || (automatic && py::hasattr(obj, "__cuda_array_interface__"))) {
        if (!py::hasattr(obj, "__cuda_array_interface__")) {
            throw py::type_error("register: obj (" + type_name(obj) + ") has no __cuda_array_interface__");
        }
        Borrowed b = from_cuda_array_interface(obj);
        if (b.readonly && writable) {
            throw py::value_error(
                "register: obj's __cuda_array_interface__ says it is read-only, but access lets "
                "the NIC write into it");
        }
        return b;
    }
    if (via == "buffer" || automatic) {
        if (PyObject_CheckBuffer(obj.ptr()) == 0) {
            throw py::type_error(
                "register: obj must expose __dlpack__, __cuda_array_interface__ or the buffer "
                "protocol (a NumPy array, a PyTorch or CuPy tensor, a bytearray, ...), not " +
                type_name(obj));
        }
        return from_buffer(obj, writable);
    }
    throw py::type_error("register: obj (" + type_name(obj) + ") cannot be registered via " + via);
}

Region::~Region() {
    close();
    try {
        py::gil_scoped_acquire gil;
        forget_cached();
        memory.hold.reset();
        owner = py::object();
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor never throws; only at interpreter exit
    }
}

Slice to_slice(const py::handle& arg, const char* name) {
    if (py::isinstance<Slice>(arg)) return arg.cast<Slice>();
    if (py::isinstance<Region>(arg)) {
        auto region = arg.cast<std::shared_ptr<Region>>();
        return Slice{region, 0, region->length};
    }
    throw py::type_error(std::string(name) +
                         " must be a gpuverbs.MemoryRegion or a LocalBuffer (region.slice()), not " + type_name(arg));
}

} // namespace gpuverbs::python
