/* The per-batch format checks of every append, in C.
 *
 * scan_records checks the framing of the records inside a v2 batch. In Python it took ~2 us
 * per record; here it is ~20 ns, so validating a batch of small records costs about as much
 * as its CRC. Each record's fields must exactly fill its length, the records must exactly
 * fill the area, and offset deltas run 0..count-1 (dense) or strictly increase. Varints are
 * decoded as directlog.records.varint.decode_varint does, refusing values that overflow
 * their type (int32 in 5 bytes, int64 in 10).
 *
 * check_batch runs everything batch.py's read_header, verify_crc and scan_records check for
 * one uncompressed batch in a single call, saving the ~2 us of Python around the CRC and the
 * scan that every append paid. It only accepts or declines: a batch it declines (compressed,
 * or failing any check) goes through the Python path, which says precisely what is wrong,
 * so the two never disagree on an error. The CRC32C comes from the crc32c package, the
 * implementation every other check uses.
 *
 * decode_area turns the records of a batch into Record objects for readers (RDMA
 * consumers, the Python client): ~5 us per record in Python, well under 1 us here. It
 * declines in the same way: records it cannot decode are left to batch.decode_records'
 * Python loop, which names the fault.
 *
 * legacy_area writes the records of a batch as legacy (magic 0 or 1) message entries, what
 * a broker sends consumers older than the v2 format: through Record objects and Python's
 * entry encoder that cost ~3 us per record, here the CRC-32 of each entry (zlib's, the
 * function Python's zlib module exposes) is most of it. It declines like decode_area.
 *
 * record_columns lays the records of many batches out as Arrow columns (offsets,
 * timestamps, keys, values, headers: validity bitmaps, offsets and data buffers), what the
 * Spark data source hands Spark without making a Python object per record. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *CorruptRecordError;
static PyObject *InvalidRecordError;
static PyObject *crc32c_function;
static PyObject *crc32_function;

enum { VARINT_MAX = 5, VARLONG_MAX = 10 };

/* Record batch v2 header layout (see batch.py and docs/formats.md). */
enum {
    BATCH_LENGTH_AT = 8,
    LEADER_EPOCH_AT = 12,
    MAGIC_AT = 16,
    CRC_AT = 17,
    ATTRIBUTES_AT = 21,
    LAST_OFFSET_DELTA_AT = 23,
    BASE_TIMESTAMP_AT = 27,
    MAX_TIMESTAMP_AT = 35,
    RECORDS_COUNT_AT = 57,
    HEADER_SIZE = 61,
    LOG_OVERHEAD = 12,
    MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD,
    MAGIC = 2,
    COMPRESSION_MASK = 0x07,
};

static inline uint64_t load_be(const uint8_t *p, int bytes)
{
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++)
        value = value << 8 | p[i];
    return value;
}

static inline int64_t be64(const uint8_t *p) { return (int64_t)load_be(p, 8); }
static inline int32_t be32(const uint8_t *p) { return (int32_t)(uint32_t)load_be(p, 4); }
static inline int16_t be16(const uint8_t *p) { return (int16_t)(uint16_t)load_be(p, 2); }

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

/* On a framing error, raise (scan_records) or just fail (check_batch declines). */
#define FAIL(kind, ...) do { if (report) PyErr_Format(kind, __VA_ARGS__); return -1; } while (0)
#define CORRUPT(...) FAIL(CorruptRecordError, __VA_ARGS__)
#define VARINT(dst, lim, max) \
    if (read_varint(buf, &pos, (lim), (max), &(dst)) != 0) \
        CORRUPT("record %zd: truncated, overlong or overflowing varint", index)

/* Check the framing of `count` records filling buf[pos:end] (bounds already checked) and
 * find their smallest and largest timestamp deltas; 0 on success, -1 on a framing error,
 * with the exception set only when `report`. */
static int scan_area(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t count,
                     int dense, int report, int64_t *min_out, int64_t *max_out)
{
    int64_t min_ts = INT64_MAX, max_ts = INT64_MIN, last_delta = -1;
    for (Py_ssize_t index = 0; index < count; index++) {
        int64_t length, ts_delta, offset_delta, key_length, value_length, headers;
        VARINT(length, end, VARINT_MAX);
        if (length < 6 || length > end - pos)
            CORRUPT("record %zd: length %lld does not fit its batch", index, (long long)length);
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        VARINT(ts_delta, record_end, VARLONG_MAX);
        VARINT(offset_delta, record_end, VARINT_MAX);
        if (dense ? offset_delta != index : offset_delta <= last_delta)
            FAIL(InvalidRecordError, "record %zd: offset delta %lld out of sequence", index,
                 (long long)offset_delta);
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
    *min_out = min_ts;
    *max_out = max_ts;
    return 0;
}

static PyObject *scan_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, count;
    int dense;
    int64_t min_ts, max_ts;
    if (!PyArg_ParseTuple(args, "y*nnnp", &view, &pos, &end, &count, &dense))
        return NULL;
    PyObject *result = NULL;
    if (pos < 0 || end < pos || end > view.len || count < 0)
        PyErr_SetString(PyExc_ValueError, "scan_records: bounds outside the buffer");
    else if (scan_area(view.buf, pos, end, count, dense, 1, &min_ts, &max_ts) == 0)
        result = Py_BuildValue("(LL)", (long long)min_ts, (long long)max_ts);
    PyBuffer_Release(&view);
    return result;
}

/* `function` (crc32c.crc32c or zlib.crc32) over buf[0:length]; -1 with an exception set. */
static int64_t checksum(PyObject *function, const uint8_t *buf, Py_ssize_t length)
{
    PyObject *area = PyMemoryView_FromMemory((char *)buf, length, PyBUF_READ);
    if (area == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(function, area);
    Py_DECREF(area);
    if (crc == NULL)
        return -1;
    unsigned long value = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    return (int64_t)value;
}

/* 1 if the CRC32C of buf[0:length] is `expected`, 0 if not, -1 with an exception set. */
static int crc_matches(const uint8_t *buf, Py_ssize_t length, uint32_t expected)
{
    int64_t value = checksum(crc32c_function, buf, length);
    return value < 0 ? -1 : value == expected;
}

/* The checks of read_header, verify_crc and scan_records for an uncompressed batch at
 * buf[pos:], which must end by `end`. 1 with the fields filled in when the batch passes,
 * 0 when it does not (or is compressed), -1 with an exception set. */
static int check_one(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, int dense,
                     int64_t fields[10])
{
    if (end - pos < HEADER_SIZE)
        return 0;
    const uint8_t *batch = buf + pos;
    int32_t batch_length = be32(batch + BATCH_LENGTH_AT);
    int16_t attributes = be16(batch + ATTRIBUTES_AT);
    int32_t last_offset_delta = be32(batch + LAST_OFFSET_DELTA_AT);
    int32_t count = be32(batch + RECORDS_COUNT_AT);
    if (batch[MAGIC_AT] != MAGIC || batch_length < MIN_BATCH_LENGTH ||
        (int64_t)batch_length + LOG_OVERHEAD > end - pos || count < 0 ||
        last_offset_delta < 0 || (attributes & COMPRESSION_MASK) != 0)
        return 0;
    Py_ssize_t size = (Py_ssize_t)batch_length + LOG_OVERHEAD;
    int crc_ok = crc_matches(batch + ATTRIBUTES_AT, size - ATTRIBUTES_AT,
                             (uint32_t)load_be(batch + CRC_AT, 4));
    if (crc_ok != 1)
        return crc_ok;
    int64_t min_delta, max_delta;
    if (scan_area(buf, pos + HEADER_SIZE, pos + size, count, dense, 0, &min_delta,
                  &max_delta) != 0)
        return 0;
    fields[0] = size;
    fields[1] = be64(batch);
    fields[2] = be32(batch + LEADER_EPOCH_AT);
    fields[3] = attributes;
    fields[4] = last_offset_delta;
    fields[5] = be64(batch + BASE_TIMESTAMP_AT);
    fields[6] = be64(batch + MAX_TIMESTAMP_AT);
    fields[7] = count;
    fields[8] = min_delta;
    fields[9] = max_delta;
    return 1;
}

static PyObject *check_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "check_batch takes 4 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    int dense = PyObject_IsTrue(args[3]);
    if (dense < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL;
    int64_t fields[10];
    int found = 0;
    if (pos < 0 || end < pos || end > view.len)
        PyErr_SetString(PyExc_ValueError, "check_batch: bounds outside the buffer");
    else
        found = check_one(view.buf, pos, end, dense, fields);
    if (found == 1)
        result = Py_BuildValue("(LLLLLLLLLL)", (long long)fields[0], (long long)fields[1],
                               (long long)fields[2], (long long)fields[3],
                               (long long)fields[4], (long long)fields[5],
                               (long long)fields[6], (long long)fields[7],
                               (long long)fields[8], (long long)fields[9]);
    else if (found == 0 && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
    PyBuffer_Release(&view);
    return result;
}

/* A bytes object of buf[*pos:*pos+length] (None for length -1), *pos moved past it. */
static PyObject *take_bytes(const uint8_t *buf, Py_ssize_t *pos, int64_t length)
{
    if (length < 0)
        return Py_NewRef(Py_None);
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)buf + *pos, (Py_ssize_t)length);
    *pos += (Py_ssize_t)length;
    return bytes;
}

#define DECLINE() do { Py_XDECREF(key); Py_XDECREF(value); Py_XDECREF(headers); goto declined; } while (0)
#define TAKE(dst, lim, max) if (read_varint(buf, &pos, (lim), (max), &(dst)) != 0) DECLINE()

/* The `count` records filling buf[pos:end] as a list of record_type(offset, timestamp, key,
 * value, headers), headers a tuple of header_type(key, value); None when they do not
 * decode (batch.decode_records then says why); NULL with an exception set on failure. */
static PyObject *decode_records_in(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end,
                                   Py_ssize_t count, int64_t base_offset,
                                   int64_t base_timestamp, PyObject *fixed_timestamp,
                                   PyObject *record_type, PyObject *header_type)
{
    int64_t fixed = 0;
    if (fixed_timestamp != Py_None) {
        fixed = PyLong_AsLongLong(fixed_timestamp);
        if (fixed == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *records = PyList_New(0);
    if (records == NULL)
        return NULL;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *key = NULL, *value = NULL, *headers = NULL;
        int64_t length, ts_delta, offset_delta, key_length, value_length, header_count;
        int64_t offset, timestamp;
        TAKE(length, end, VARINT_MAX);
        if (length < 6 || length > end - pos)
            DECLINE();
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        TAKE(ts_delta, record_end, VARLONG_MAX);
        TAKE(offset_delta, record_end, VARINT_MAX);
        TAKE(key_length, record_end, VARINT_MAX);
        if (key_length < -1 || key_length > record_end - pos)
            DECLINE();
        if ((key = take_bytes(buf, &pos, key_length)) == NULL)
            goto failed;
        TAKE(value_length, record_end, VARINT_MAX);
        if (value_length < -1 || value_length > record_end - pos)
            DECLINE();
        if ((value = take_bytes(buf, &pos, value_length)) == NULL)
            goto failed_record;
        TAKE(header_count, record_end, VARINT_MAX);
        if (header_count < 0 || header_count > record_end - pos)
            DECLINE();
        if ((headers = PyTuple_New((Py_ssize_t)header_count)) == NULL)
            goto failed_record;
        for (int64_t h = 0; h < header_count; h++) {
            int64_t header_key, header_value;
            TAKE(header_key, record_end, VARINT_MAX);
            if (header_key < 0 || header_key > record_end - pos)
                DECLINE();
            PyObject *name = PyUnicode_DecodeUTF8((const char *)buf + pos,
                                                  (Py_ssize_t)header_key, NULL);
            if (name == NULL) {
                PyErr_Clear(); /* not UTF-8: the Python path reports it */
                DECLINE();
            }
            pos += (Py_ssize_t)header_key;
            if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_value) != 0 ||
                header_value < -1 || header_value > record_end - pos) {
                Py_DECREF(name);
                DECLINE();
            }
            PyObject *data = take_bytes(buf, &pos, header_value);
            if (data == NULL) {
                Py_DECREF(name);
                goto failed_record;
            }
            PyObject *args[2] = {name, data};
            PyObject *header = PyObject_Vectorcall(header_type, args, 2, NULL);
            Py_DECREF(name);
            Py_DECREF(data);
            if (header == NULL)
                goto failed_record;
            PyTuple_SET_ITEM(headers, (Py_ssize_t)h, header);
        }
        if (pos != record_end || __builtin_add_overflow(base_offset, offset_delta, &offset))
            DECLINE();
        if (fixed_timestamp != Py_None)
            timestamp = fixed;
        else if (__builtin_add_overflow(base_timestamp, ts_delta, &timestamp))
            DECLINE();
        PyObject *numbers[2] = {PyLong_FromLongLong(offset), PyLong_FromLongLong(timestamp)};
        if (numbers[0] == NULL || numbers[1] == NULL) {
            Py_XDECREF(numbers[0]);
            Py_XDECREF(numbers[1]);
            goto failed_record;
        }
        PyObject *args[5] = {numbers[0], numbers[1], key, value, headers};
        PyObject *record = PyObject_Vectorcall(record_type, args, 5, NULL);
        Py_DECREF(numbers[0]);
        Py_DECREF(numbers[1]);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(headers);
        if (record == NULL)
            goto failed;
        int appended = PyList_Append(records, record);
        Py_DECREF(record);
        if (appended < 0)
            goto failed;
        continue;
    failed_record:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        goto failed;
    }
    if (pos != end)
        goto declined;
    return records;
declined:
    Py_DECREF(records);
    return Py_NewRef(Py_None);
failed:
    Py_DECREF(records);
    return NULL;
}

static PyObject *decode_area(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "decode_area takes 9 arguments");
        return NULL;
    }
    Py_ssize_t bounds[3];
    for (int i = 0; i < 3; i++) {
        bounds[i] = PyLong_AsSsize_t(args[1 + i]);
        if (bounds[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    int64_t base_offset = PyLong_AsLongLong(args[4]);
    if (base_offset == -1 && PyErr_Occurred())
        return NULL;
    int64_t base_timestamp = PyLong_AsLongLong(args[5]);
    if (base_timestamp == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t pos = bounds[0], end = bounds[1], count = bounds[2];
    if (pos < 0 || end < pos || end > view.len || count < 0)
        PyErr_SetString(PyExc_ValueError, "decode_area: bounds outside the buffer");
    else
        result = decode_records_in(view.buf, pos, end, count, base_offset, base_timestamp,
                                   args[6], args[7], args[8]);
    PyBuffer_Release(&view);
    return result;
}

static inline void store_be(uint8_t *p, uint64_t value, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

/* One v2 record's fields at buf[*pos:end]: 0 with them filled in, -1 when it does not
 * decode (the caller declines). Headers are skipped: the legacy formats have none. */
static int legacy_fields(const uint8_t *buf, Py_ssize_t *at, Py_ssize_t end,
                         int64_t *ts_delta, int64_t *offset_delta, Py_ssize_t *key_at,
                         int64_t *key_length, Py_ssize_t *value_at, int64_t *value_length)
{
    Py_ssize_t pos = *at;
    int64_t length, header_count;
    if (read_varint(buf, &pos, end, VARINT_MAX, &length) != 0 || length < 6 ||
        length > end - pos)
        return -1;
    Py_ssize_t record_end = pos + (Py_ssize_t)length;
    pos += 1; /* attributes */
    if (read_varint(buf, &pos, record_end, VARLONG_MAX, ts_delta) != 0 ||
        read_varint(buf, &pos, record_end, VARINT_MAX, offset_delta) != 0 ||
        read_varint(buf, &pos, record_end, VARINT_MAX, key_length) != 0 ||
        *key_length < -1 || *key_length > record_end - pos)
        return -1;
    *key_at = pos;
    pos += *key_length > 0 ? (Py_ssize_t)*key_length : 0;
    if (read_varint(buf, &pos, record_end, VARINT_MAX, value_length) != 0 ||
        *value_length < -1 || *value_length > record_end - pos)
        return -1;
    *value_at = pos;
    pos += *value_length > 0 ? (Py_ssize_t)*value_length : 0;
    if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_count) != 0 || header_count < 0)
        return -1;
    for (int64_t h = 0; h < header_count; h++) {
        int64_t header_key, header_value;
        if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_key) != 0 ||
            header_key < 0 || header_key > record_end - pos)
            return -1;
        pos += (Py_ssize_t)header_key;
        if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_value) != 0 ||
            header_value < -1 || header_value > record_end - pos)
            return -1;
        pos += header_value > 0 ? (Py_ssize_t)header_value : 0;
    }
    if (pos != record_end)
        return -1;
    *at = pos;
    return 0;
}

/* Bytes of a legacy entry besides its key and value: offset, size, crc, magic, attributes,
 * timestamp (magic 1), key and value lengths. */
static inline Py_ssize_t legacy_entry_overhead(int magic)
{
    return 12 + 4 + 2 + (magic == 1 ? 8 : 0) + 4 + 4;
}

/* The bytes the `count` records filling buf[pos:end] take as legacy entries of `magic`;
 * -1 when they do not decode. */
static Py_ssize_t legacy_entries_size(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end,
                                      int64_t count, int magic)
{
    Py_ssize_t size = 0;
    for (int64_t index = 0; index < count; index++) {
        int64_t ts_delta, offset_delta, key_length, value_length;
        Py_ssize_t key_at, value_at;
        if (legacy_fields(buf, &pos, end, &ts_delta, &offset_delta, &key_at, &key_length,
                          &value_at, &value_length) != 0)
            return -1;
        size += legacy_entry_overhead(magic) + (key_length > 0 ? key_length : 0) +
                (value_length > 0 ? value_length : 0);
    }
    return pos == end && count > 0 ? size : -1;
}

/* legacy_size(buffer, pos, end, count, magic) -> the bytes legacy_area would write for
 * these records uncompressed, or None when they do not decode: an uncompressed batch's
 * converted size without converting it. */
static PyObject *legacy_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "legacy_size takes 5 arguments");
        return NULL;
    }
    int64_t n[5] = {0};
    for (int i = 1; i < 5; i++) {
        n[i] = PyLong_AsLongLong(args[i]);
        if (n[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    if (n[4] != 0 && n[4] != 1) {
        PyErr_SetString(PyExc_ValueError, "legacy_size: magic must be 0 or 1");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t pos = (Py_ssize_t)n[1], end = (Py_ssize_t)n[2];
    if (pos < 0 || end < pos || end > view.len || n[3] < 0) {
        PyErr_SetString(PyExc_ValueError, "legacy_size: bounds outside the buffer");
    } else {
        Py_ssize_t size = legacy_entries_size(view.buf, pos, end, n[3], (int)n[4]);
        result = size < 0 ? Py_NewRef(Py_None) : PyLong_FromSsize_t(size);
    }
    PyBuffer_Release(&view);
    return result;
}

/* legacy_area(buffer, pos, end, count, base_offset, base_timestamp, fixed_timestamp, magic,
 * attributes, relative) -> (entries, last_offset, max_timestamp) or None: the `count`
 * records filling buffer[pos:end] as legacy entries of `magic` with `attributes`, each at
 * its absolute offset, or, when `relative`, at its offset from the first record's (the
 * inner entries of a magic 1 wrapper). A magic 1 entry carries the record's timestamp, or
 * `fixed_timestamp` when not None (LogAppendTime). */
static PyObject *legacy_area(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "legacy_area takes 10 arguments");
        return NULL;
    }
    int64_t n[10] = {0};
    for (int i = 1; i < 10; i++) {
        if (i == 6 && args[i] == Py_None)
            continue; /* no fixed timestamp */
        n[i] = PyLong_AsLongLong(args[i]);
        if (n[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t pos = (Py_ssize_t)n[1], end = (Py_ssize_t)n[2];
    int64_t count = n[3], base_offset = n[4], base_timestamp = n[5], fixed = n[6];
    int fixed_set = args[6] != Py_None;
    int magic = (int)n[7], attributes = (int)n[8], relative = n[9] != 0;
    if (magic != 0 && magic != 1) {
        PyErr_SetString(PyExc_ValueError, "legacy_area: magic must be 0 or 1");
        return NULL;
    }
    Py_ssize_t entry_fixed = legacy_entry_overhead(magic);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL;
    const uint8_t *buf = view.buf;
    if (pos < 0 || end < pos || end > view.len || count < 0) {
        PyErr_SetString(PyExc_ValueError, "legacy_area: bounds outside the buffer");
        goto done;
    }
    Py_ssize_t size = legacy_entries_size(buf, pos, end, count, magic), at;
    if (size < 0)
        goto declined;
    PyObject *entries = PyBytes_FromStringAndSize(NULL, size);
    if (entries == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(entries);
    int64_t first_offset = 0, offset = 0, max_timestamp = INT64_MIN;
    at = pos;
    for (int64_t index = 0; index < count; index++) {
        int64_t ts_delta, offset_delta, key_length, value_length, timestamp;
        Py_ssize_t key_at, value_at;
        legacy_fields(buf, &at, end, &ts_delta, &offset_delta, &key_at, &key_length, &value_at,
                      &value_length);
        if (__builtin_add_overflow(base_offset, offset_delta, &offset) ||
            (!fixed_set && __builtin_add_overflow(base_timestamp, ts_delta, &timestamp))) {
            Py_DECREF(entries);
            goto declined;
        }
        if (fixed_set)
            timestamp = fixed;
        if (index == 0)
            first_offset = offset;
        if (timestamp > max_timestamp)
            max_timestamp = timestamp;
        uint8_t *entry = out;
        Py_ssize_t body = entry_fixed - 12 + (key_length > 0 ? key_length : 0) +
                          (value_length > 0 ? value_length : 0);
        store_be(out, (uint64_t)(relative ? offset - first_offset : offset), 8);
        store_be(out + 8, (uint64_t)body, 4);
        out += 16; /* the CRC goes in last */
        *out++ = (uint8_t)magic;
        *out++ = (uint8_t)attributes;
        if (magic == 1) {
            store_be(out, (uint64_t)timestamp, 8);
            out += 8;
        }
        store_be(out, (uint64_t)key_length, 4);
        out += 4;
        if (key_length > 0) {
            memcpy(out, buf + key_at, (size_t)key_length);
            out += key_length;
        }
        store_be(out, (uint64_t)value_length, 4);
        out += 4;
        if (value_length > 0) {
            memcpy(out, buf + value_at, (size_t)value_length);
            out += value_length;
        }
        int64_t crc = checksum(crc32_function, entry + 16, out - (entry + 16));
        if (crc < 0) {
            Py_DECREF(entries);
            goto done;
        }
        store_be(entry + 12, (uint64_t)crc, 4);
    }
    result = Py_BuildValue("(NLL)", entries, (long long)offset, (long long)max_timestamp);
    goto done;
declined:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return result;
}

/* Arrow buffers are little-endian; record_columns writes native integers into them. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "record_columns lays out Arrow buffers for little-endian machines only"
#endif

/* A growing byte buffer for record_columns. */
typedef struct {
    uint8_t *data;
    Py_ssize_t size, capacity;
} Grow;

static int grow_reserve(Grow *g, Py_ssize_t more)
{
    if (g->size + more <= g->capacity)
        return 0;
    Py_ssize_t capacity = g->capacity ? g->capacity : 4096;
    while (capacity < g->size + more)
        capacity *= 2;
    uint8_t *data = PyMem_Realloc(g->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->data = data;
    g->capacity = capacity;
    return 0;
}

static int grow_put(Grow *g, const void *bytes, Py_ssize_t length)
{
    if (grow_reserve(g, length) != 0)
        return -1;
    if (length > 0)
        memcpy(g->data + g->size, bytes, (size_t)length);
    g->size += length;
    return 0;
}

/* Arrow's validity bitmap: bit i of byte i / 8, least significant first. */
static int bit_put(Grow *g, Py_ssize_t index, int valid)
{
    if (index % 8 == 0 && grow_put(g, "\0", 1) != 0)
        return -1;
    if (valid)
        g->data[index / 8] |= (uint8_t)(1u << (index % 8));
    return 0;
}

/* A nullable binary column: validity, int32 offsets (starting at 0), data. */
typedef struct {
    Grow valid, offsets, data;
    Py_ssize_t nulls;
} Column;

static int column_put(Column *c, Py_ssize_t index, const uint8_t *bytes, int64_t length)
{
    if (bit_put(&c->valid, index, length >= 0) != 0)
        return -1;
    if (length < 0)
        c->nulls++;
    else if (grow_put(&c->data, bytes, (Py_ssize_t)length) != 0)
        return -1;
    if (c->data.size > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "record_columns: over 2 GiB in one column");
        return -1;
    }
    int32_t end = (int32_t)c->data.size;
    return grow_put(&c->offsets, &end, 4);
}

static int column_offsets_start(Column *c)
{
    int32_t zero = 0;
    return grow_put(&c->offsets, &zero, 4);
}

static void column_free(Column *c)
{
    PyMem_Free(c->valid.data);
    PyMem_Free(c->offsets.data);
    PyMem_Free(c->data.data);
}

static PyObject *grow_bytes(Grow *g)
{
    return PyBytes_FromStringAndSize((const char *)g->data, g->size);
}

static void grow_free(Grow *g) { PyMem_Free(g->data); }

/* record_columns(areas, lower, upper, headers) -> (rows, offsets, timestamps, types,
 * (key valid, key offsets, key data, key nulls), (value ...), headers or None) or None.
 * `areas`: (buffer, count, base_offset, base_timestamp, fixed_timestamp or None,
 * timestamp_type) per batch, the buffer holding its (decompressed) records. Records with
 * offsets in [lower, upper) become rows: offsets int64, timestamps int64 microseconds,
 * types int32, keys and values nullable binary columns, and, when `headers`, a list column
 * as (list offsets, (name valid, name offsets, name data, nulls), (value ...)). None when a
 * record does not decode (batch.decode_records then says why). */
static PyObject *record_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record_columns takes 4 arguments");
        return NULL;
    }
    PyObject *areas = args[0];
    int64_t lower = PyLong_AsLongLong(args[1]), upper = PyLong_AsLongLong(args[2]);
    int with_headers = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || with_headers < 0)
        return NULL;
    if (!PyList_Check(areas)) {
        PyErr_SetString(PyExc_TypeError, "record_columns: areas must be a list");
        return NULL;
    }
    Grow offsets = {0}, timestamps = {0}, types = {0}, header_offsets = {0};
    Column keys = {{0}}, values = {{0}}, names = {{0}}, header_values = {{0}};
    Py_ssize_t rows = 0, header_rows = 0;
    int declined = 0;
    if (column_offsets_start(&keys) || column_offsets_start(&values) ||
        column_offsets_start(&names) || column_offsets_start(&header_values))
        goto failed;
    int32_t zero = 0;
    if (with_headers && grow_put(&header_offsets, &zero, 4) != 0)
        goto failed;
    for (Py_ssize_t a = 0; a < PyList_GET_SIZE(areas) && !declined; a++) {
        PyObject *item = PyList_GET_ITEM(areas, a);
        PyObject *buffer, *fixed_object;
        long long count, base_offset, base_timestamp;
        int timestamp_type;
        if (!PyArg_ParseTuple(item, "OLLLOi", &buffer, &count, &base_offset, &base_timestamp,
                              &fixed_object, &timestamp_type))
            goto failed;
        int64_t fixed = 0;
        if (fixed_object != Py_None && (fixed = PyLong_AsLongLong(fixed_object)) == -1 &&
            PyErr_Occurred())
            goto failed;
        Py_buffer view;
        if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) != 0)
            goto failed;
        const uint8_t *buf = view.buf;
        Py_ssize_t pos = 0, end = view.len;
        for (long long index = 0; index < count; index++) {
            int64_t length, ts_delta, offset_delta, key_length, value_length, header_count;
            if (read_varint(buf, &pos, end, VARINT_MAX, &length) != 0 || length < 6 ||
                length > end - pos) {
                declined = 1;
                break;
            }
            Py_ssize_t record_end = pos + (Py_ssize_t)length;
            pos += 1; /* attributes */
            if (read_varint(buf, &pos, record_end, VARLONG_MAX, &ts_delta) != 0 ||
                read_varint(buf, &pos, record_end, VARINT_MAX, &offset_delta) != 0 ||
                read_varint(buf, &pos, record_end, VARINT_MAX, &key_length) != 0 ||
                key_length < -1 || key_length > record_end - pos) {
                declined = 1;
                break;
            }
            Py_ssize_t key_at = pos;
            pos += key_length > 0 ? (Py_ssize_t)key_length : 0;
            if (read_varint(buf, &pos, record_end, VARINT_MAX, &value_length) != 0 ||
                value_length < -1 || value_length > record_end - pos) {
                declined = 1;
                break;
            }
            Py_ssize_t value_at = pos;
            pos += value_length > 0 ? (Py_ssize_t)value_length : 0;
            if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_count) != 0 ||
                header_count < 0 || header_count > record_end - pos) {
                declined = 1;
                break;
            }
            int64_t offset = base_offset + offset_delta;
            int keep = offset >= lower && offset < upper;
            for (int64_t h = 0; h < header_count; h++) {
                int64_t name_length, header_length;
                if (read_varint(buf, &pos, record_end, VARINT_MAX, &name_length) != 0 ||
                    name_length < 0 || name_length > record_end - pos) {
                    declined = 1;
                    break;
                }
                Py_ssize_t name_at = pos;
                pos += (Py_ssize_t)name_length;
                if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_length) != 0 ||
                    header_length < -1 || header_length > record_end - pos) {
                    declined = 1;
                    break;
                }
                Py_ssize_t header_at = pos;
                pos += header_length > 0 ? (Py_ssize_t)header_length : 0;
                if (keep && with_headers) {
                    if (column_put(&names, header_rows, buf + name_at, name_length) != 0 ||
                        column_put(&header_values, header_rows, buf + header_at,
                                   header_length) != 0) {
                        PyBuffer_Release(&view);
                        goto failed;
                    }
                    header_rows++;
                }
            }
            if (declined || pos != record_end) {
                declined = 1;
                break;
            }
            if (!keep)
                continue;
            int64_t timestamp = fixed_object != Py_None ? fixed : base_timestamp + ts_delta;
            int64_t micros = timestamp * 1000;
            int32_t header_end = (int32_t)header_rows;
            if (grow_put(&offsets, &offset, 8) != 0 || grow_put(&timestamps, &micros, 8) != 0 ||
                grow_put(&types, &timestamp_type, 4) != 0 ||
                column_put(&keys, rows, buf + key_at, key_length) != 0 ||
                column_put(&values, rows, buf + value_at, value_length) != 0 ||
                (with_headers && grow_put(&header_offsets, &header_end, 4) != 0)) {
                PyBuffer_Release(&view);
                goto failed;
            }
            rows++;
        }
        if (!declined && pos != end)
            declined = 1;
        PyBuffer_Release(&view);
    }
    PyObject *result;
    if (declined) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *header_part = Py_None;
        if (with_headers)
            header_part = Py_BuildValue(
                "(N(NNNn)(NNNn))", grow_bytes(&header_offsets), grow_bytes(&names.valid),
                grow_bytes(&names.offsets), grow_bytes(&names.data), names.nulls,
                grow_bytes(&header_values.valid), grow_bytes(&header_values.offsets),
                grow_bytes(&header_values.data), header_values.nulls);
        else
            Py_INCREF(Py_None);
        if (header_part == NULL)
            goto failed;
        result = Py_BuildValue(
            "(nNNN(NNNn)(NNNn)N)", rows, grow_bytes(&offsets), grow_bytes(&timestamps),
            grow_bytes(&types), grow_bytes(&keys.valid), grow_bytes(&keys.offsets),
            grow_bytes(&keys.data), keys.nulls, grow_bytes(&values.valid),
            grow_bytes(&values.offsets), grow_bytes(&values.data), values.nulls, header_part);
    }
    grow_free(&offsets), grow_free(&timestamps), grow_free(&types), grow_free(&header_offsets);
    column_free(&keys), column_free(&values), column_free(&names), column_free(&header_values);
    return result;
failed:
    grow_free(&offsets), grow_free(&timestamps), grow_free(&types), grow_free(&header_offsets);
    column_free(&keys), column_free(&values), column_free(&names), column_free(&header_values);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(buffer, pos, end, count, dense) -> (min_ts_delta, max_ts_delta)"},
    {"check_batch", (PyCFunction)(void (*)(void))check_batch, METH_FASTCALL,
     "check_batch(buffer, pos, end, dense) -> (size, base_offset, partition_leader_epoch, "
     "attributes, last_offset_delta, base_timestamp, max_timestamp, records_count, "
     "min_ts_delta, max_ts_delta) or None"},
    {"decode_area", (PyCFunction)(void (*)(void))decode_area, METH_FASTCALL,
     "decode_area(buffer, pos, end, count, base_offset, base_timestamp, fixed_timestamp, "
     "record_type, header_type) -> list of records, or None when they do not decode"},
    {"legacy_area", (PyCFunction)(void (*)(void))legacy_area, METH_FASTCALL,
     "legacy_area(buffer, pos, end, count, base_offset, base_timestamp, fixed_timestamp, "
     "magic, attributes, relative) -> (entries, last_offset, max_timestamp), or None when "
     "the records do not decode"},
    {"legacy_size", (PyCFunction)(void (*)(void))legacy_size, METH_FASTCALL,
     "legacy_size(buffer, pos, end, count, magic) -> bytes of the uncompressed legacy "
     "entries, or None when the records do not decode"},
    {"record_columns", (PyCFunction)(void (*)(void))record_columns, METH_FASTCALL,
     "record_columns(areas, lower, upper, headers) -> Arrow column buffers of the records "
     "with offsets in [lower, upper), or None when a record does not decode"},
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
    PyObject *crc32c = PyImport_ImportModule("crc32c");
    if (crc32c == NULL)
        return NULL;
    crc32c_function = PyObject_GetAttrString(crc32c, "crc32c");
    Py_DECREF(crc32c);
    if (crc32c_function == NULL)
        return NULL;
    PyObject *zlib = PyImport_ImportModule("zlib");
    if (zlib == NULL)
        return NULL;
    crc32_function = PyObject_GetAttrString(zlib, "crc32");
    Py_DECREF(zlib);
    if (crc32_function == NULL)
        return NULL;
    return PyModule_Create(&module);
}
