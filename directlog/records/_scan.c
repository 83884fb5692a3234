/* Framing check of the records inside a v2 batch, the per-record work of every append.
 *
 * In Python it took ~2 us per record; here it is ~20 ns, so validating a batch of small
 * records costs about as much as its CRC. Each record's fields must exactly fill its length,
 * the records must exactly fill the area, and offset deltas run 0..count-1 (dense) or
 * strictly increase. Varints are decoded as directlog.records.varint.decode_varint does,
 * refusing values that overflow their type (int32 in 5 bytes, int64 in 10). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *CorruptRecordError;
static PyObject *InvalidRecordError;

enum { VARINT_MAX = 5, VARLONG_MAX = 10 };

/* Decode a zig-zag varint at buf[*pos] ending before limit; 0 on success. */
static inline int read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t limit,
                              int max_bytes, int64_t *out)
{
    uint64_t unsigned_value = 0;
    Py_ssize_t p = *pos;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= limit)
            return -1;
        uint8_t byte = buf[p++];
        unsigned_value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            if (max_bytes == VARINT_MAX ? unsigned_value >> 32 != 0 : (i == 9 && byte > 1))
                return -1; /* overflows int32 / int64 */
            *out = (int64_t)(unsigned_value >> 1) ^ -(int64_t)(unsigned_value & 1);
            *pos = p;
            return 0;
        }
    }
    return -1;
}

#define CORRUPT(...) do { PyErr_Format(CorruptRecordError, __VA_ARGS__); goto fail; } while (0)
#define VARINT(dst, lim, max) \
    if (read_varint(buf, &pos, (lim), (max), &(dst)) != 0) \
        CORRUPT("record %zd: truncated, overlong or overflowing varint", index)

static PyObject *scan_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, count;
    int dense;
    if (!PyArg_ParseTuple(args, "y*nnnp", &view, &pos, &end, &count, &dense))
        return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t index = 0;
    int64_t min_ts = INT64_MAX, max_ts = INT64_MIN, last_delta = -1;
    if (pos < 0 || end < pos || end > view.len || count < 0) {
        PyErr_SetString(PyExc_ValueError, "scan_records: bounds outside the buffer");
        goto fail;
    }
    for (index = 0; index < count; index++) {
        int64_t length, ts_delta, offset_delta, key_length, value_length, headers;
        VARINT(length, end, VARINT_MAX);
        if (length < 6 || length > end - pos)
            CORRUPT("record %zd: length %lld does not fit its batch", index, (long long)length);
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        VARINT(ts_delta, record_end, VARLONG_MAX);
        VARINT(offset_delta, record_end, VARINT_MAX);
        if (dense ? offset_delta != index : offset_delta <= last_delta) {
            PyErr_Format(InvalidRecordError, "record %zd: offset delta %lld out of sequence",
                         index, (long long)offset_delta);
            goto fail;
        }
        last_delta = offset_delta;
        VARINT(key_length, record_end, VARINT_MAX);
        if (key_length < -1 || key_length > record_end - pos)
            CORRUPT("record %zd: key length %lld", index, (long long)key_length);
        if (key_length > 0)
            pos += (Py_ssize_t)key_length;
        VARINT(value_length, record_end, VARINT_MAX);
        if (value_length < -1 || value_length > record_end - pos)
            CORRUPT("record %zd: value length %lld", index, (long long)value_length);
        if (value_length > 0)
            pos += (Py_ssize_t)value_length;
        VARINT(headers, record_end, VARINT_MAX);
        if (headers < 0)
            CORRUPT("record %zd: negative header count", index);
        for (int64_t h = 0; h < headers; h++) {
            int64_t header_key, header_value;
            VARINT(header_key, record_end, VARINT_MAX);
            if (header_key < 0 || header_key > record_end - pos)
                CORRUPT("record %zd: header key length %lld", index, (long long)header_key);
            pos += (Py_ssize_t)header_key;
            VARINT(header_value, record_end, VARINT_MAX);
            if (header_value < -1 || header_value > record_end - pos)
                CORRUPT("record %zd: header value length %lld", index, (long long)header_value);
            if (header_value > 0)
                pos += (Py_ssize_t)header_value;
        }
        if (pos != record_end)
            CORRUPT("record %zd: fields fill %zd of %lld bytes", index,
                    pos - record_end + (Py_ssize_t)length, (long long)length);
        if (ts_delta < min_ts)
            min_ts = ts_delta;
        if (ts_delta > max_ts)
            max_ts = ts_delta;
    }
    if (pos != end)
        CORRUPT("%zd bytes after the last of %zd records", end - pos, count);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", (long long)min_ts, (long long)max_ts);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(buffer, pos, end, count, dense) -> (min_ts_delta, max_ts_delta)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void)
{
    PyObject *errors = PyImport_ImportModule("directlog.records.errors");
    if (errors == NULL)
        return NULL;
    CorruptRecordError = PyObject_GetAttrString(errors, "CorruptRecordError");
    InvalidRecordError = PyObject_GetAttrString(errors, "InvalidRecordError");
    Py_DECREF(errors);
    if (CorruptRecordError == NULL || InvalidRecordError == NULL)
        return NULL;
    return PyModule_Create(&module);
}
