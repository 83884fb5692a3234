/* 64-bit atomics on (shared) memory, for the RDMA providers.
 *
 * The shm provider executes FETCH_AND_ADD and COMPARE_AND_SWAP as CPU atomics on a word of a
 * file mapped MAP_SHARED by several processes, and its region table and completion rings
 * hand words between processes with acquire/release ordering. Python has no atomic access
 * to a buffer, so these few functions wrap the GCC __atomic builtins (lock-free on 64-bit
 * words, hence also atomic across processes). Every access is sequentially consistent:
 * the revocation protocol (docs/rdma.md) is a Dekker-style handshake that needs it.
 *
 * Each function takes any object exporting a buffer and a byte offset; the word must lie
 * inside the buffer and be 8-byte aligned (IndexError / ValueError otherwise), so a caller
 * can never touch memory outside what it holds. Values are native-endian unsigned 64-bit;
 * arguments are taken modulo 2**64 (fetch_add(buf, off, 2**64 - 1) subtracts one).
 * address() gives the virtual address of a buffer, which registered regions advertise.
 *
 * guarded_copy() is the shm provider's READ and WRITE in one call: the region table's
 * admit, the copy and the finish (region_table.py), which in Python cost more than the
 * copy of a small op itself. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The word at buffer[offset], with the buffer held in *view (release it after use). */
static uint64_t *word_at(PyObject *buffer, PyObject *offset_obj, int flags, Py_buffer *view)
{
    Py_ssize_t offset = PyLong_AsSsize_t(offset_obj);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(buffer, view, flags) < 0)
        return NULL;
    if (offset < 0 || view->len < 8 || offset > view->len - 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_IndexError, "word at %zd outside a buffer of %zd bytes", offset,
                     view->len);
        return NULL;
    }
    uintptr_t address = (uintptr_t)view->buf + (uintptr_t)offset;
    if (address % 8 != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "word at %zd is not 8-byte aligned", offset);
        return NULL;
    }
    return (uint64_t *)address;
}

static int unsigned_arg(PyObject *obj, uint64_t *out)
{
    unsigned long long value = PyLong_AsUnsignedLongLongMask(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)value;
    return 0;
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return -1;
}

static PyObject *fetch_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    uint64_t value, old;
    if (check_nargs("fetch_add", nargs, 3) < 0 || unsigned_arg(args[2], &value) < 0)
        return NULL;
    uint64_t *word = word_at(args[0], args[1], PyBUF_WRITABLE, &view);
    if (word == NULL)
        return NULL;
    old = __atomic_fetch_add(word, value, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(old);
}

static PyObject *compare_exchange(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    uint64_t expected, desired;
    if (check_nargs("compare_exchange", nargs, 4) < 0 || unsigned_arg(args[2], &expected) < 0 ||
        unsigned_arg(args[3], &desired) < 0)
        return NULL;
    uint64_t *word = word_at(args[0], args[1], PyBUF_WRITABLE, &view);
    if (word == NULL)
        return NULL;
    /* On failure `expected` receives the current value: either way it ends as the old one. */
    __atomic_compare_exchange_n(word, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(expected);
}

static PyObject *load(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    if (check_nargs("load", nargs, 2) < 0)
        return NULL;
    uint64_t *word = word_at(args[0], args[1], PyBUF_SIMPLE, &view);
    if (word == NULL)
        return NULL;
    uint64_t value = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *store(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    uint64_t value;
    if (check_nargs("store", nargs, 3) < 0 || unsigned_arg(args[2], &value) < 0)
        return NULL;
    uint64_t *word = word_at(args[0], args[1], PyBUF_WRITABLE, &view);
    if (word == NULL)
        return NULL;
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *address(PyObject *module, PyObject *buffer)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uintptr_t value = (uintptr_t)view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)value);
}

/* A byte range of a buffer, bounds-checked, held in *view (release it after use). */
static char *range_at(PyObject *buffer, PyObject *offset_obj, Py_ssize_t length, int flags,
                      Py_buffer *view)
{
    Py_ssize_t offset = PyLong_AsSsize_t(offset_obj);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(buffer, view, flags) < 0)
        return NULL;
    if (offset < 0 || offset > view->len - length) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_IndexError, "%zd bytes at %zd outside a buffer of %zd bytes", length,
                     offset, view->len);
        return NULL;
    }
    return (char *)view->buf + offset;
}

enum { COPIED = 0, NOT_ADMITTED = 1, RACED = 2 };

/* guarded_copy(table, entry, ctl, dst, dst_offset, src, src_offset, length) -> int
 *
 * Under the region-table entry at byte `entry` of `table` (its ctl word first, its inflight
 * count 8 bytes on): count this access in, and unless the ctl word is no longer `ctl`
 * (revoked: NOT_ADMITTED, nothing copied), copy `length` bytes from src to dst, look at
 * ctl once more (RACED when a revocation came meanwhile, COPIED otherwise) and count the
 * access out. The same handshake as TableView.admit and finish. */
static PyObject *guarded_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer table, dst_view, src_view;
    uint64_t ctl;
    int result = COPIED;
    if (check_nargs("guarded_copy", nargs, 8) < 0 || unsigned_arg(args[2], &ctl) < 0)
        return NULL;
    Py_ssize_t length = PyLong_AsSsize_t(args[7]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    if (length < 0)
        return PyErr_Format(PyExc_ValueError, "negative length %zd", length);
    char *entry = range_at(args[0], args[1], 16, PyBUF_WRITABLE, &table);
    if (entry == NULL)
        return NULL;
    if ((uintptr_t)entry % 8 != 0) {
        PyBuffer_Release(&table);
        return PyErr_Format(PyExc_ValueError, "table entry is not 8-byte aligned");
    }
    char *dst = range_at(args[3], args[4], length, PyBUF_WRITABLE, &dst_view);
    if (dst == NULL) {
        PyBuffer_Release(&table);
        return NULL;
    }
    char *src = range_at(args[5], args[6], length, PyBUF_SIMPLE, &src_view);
    if (src == NULL) {
        PyBuffer_Release(&dst_view);
        PyBuffer_Release(&table);
        return NULL;
    }
    uint64_t *ctl_word = (uint64_t *)entry, *inflight = (uint64_t *)(entry + 8);
    __atomic_fetch_add(inflight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(ctl_word, __ATOMIC_SEQ_CST) != ctl) {
        result = NOT_ADMITTED;
    } else {
        memmove(dst, src, (size_t)length);
        if (__atomic_load_n(ctl_word, __ATOMIC_SEQ_CST) != ctl)
            result = RACED;
    }
    __atomic_fetch_sub(inflight, 1, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&src_view);
    PyBuffer_Release(&dst_view);
    PyBuffer_Release(&table);
    return PyLong_FromLong(result);
}

static PyMethodDef methods[] = {
    {"fetch_add", (PyCFunction)(void (*)(void))fetch_add, METH_FASTCALL,
     "fetch_add(buffer, offset, value) -> old: atomically add value to the word."},
    {"compare_exchange", (PyCFunction)(void (*)(void))compare_exchange, METH_FASTCALL,
     "compare_exchange(buffer, offset, expected, desired) -> old: store desired if the word "
     "equals expected; the old value either way."},
    {"load", (PyCFunction)(void (*)(void))load, METH_FASTCALL,
     "load(buffer, offset) -> value: an atomic read of the word."},
    {"store", (PyCFunction)(void (*)(void))store, METH_FASTCALL,
     "store(buffer, offset, value): an atomic write of the word."},
    {"address", address, METH_O, "address(buffer) -> int: the buffer's virtual address."},
    {"guarded_copy", (PyCFunction)(void (*)(void))guarded_copy, METH_FASTCALL,
     "guarded_copy(table, entry, ctl, dst, dst_offset, src, src_offset, length) -> int: "
     "copy under a region-table entry's admit/finish handshake; 0 copied, 1 not admitted "
     "(revoked, nothing copied), 2 copied while a revocation raced it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_atomics", "64-bit atomics on shared memory.", -1, methods,
};

PyMODINIT_FUNC PyInit__atomics(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddIntConstant(module, "COPIED", COPIED) < 0 ||
        PyModule_AddIntConstant(module, "NOT_ADMITTED", NOT_ADMITTED) < 0 ||
        PyModule_AddIntConstant(module, "RACED", RACED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
