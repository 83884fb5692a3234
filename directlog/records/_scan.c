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
 * record_columns walks the record batches of a fetch answer and lays their records out as
 * Arrow columns (offsets, timestamps, keys, values, headers: validity bitmaps, offsets and
 * data buffers), what the Spark data source hands Spark without making a Python object per
 * record, nor per batch for uncompressed ones. */
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
    LAST_CODEC = 4, /* zstd: ids 5 to 7 name no codec */
    TIMESTAMP_TYPE_FLAG = 0x08,
    CONTROL_FLAG = 0x20,
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

/* The header fields of one batch that the C paths use. */
typedef struct {
    Py_ssize_t size; /* of the whole batch */
    int64_t base_offset, base_timestamp, max_timestamp;
    int32_t leader_epoch, last_offset_delta, count;
    int16_t attributes;
} BatchHeader;

/* The header of the batch at buf[pos:], which must end by `end`, bounded as batch.py's
 * read_header bounds it (sizes, magic, counts, the codec id; not the CRC): 1 with `header`
 * filled in when it passes, 0 when not (the Python path then names the fault). */
static int read_header(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end,
                       BatchHeader *header)
{
    if (end - pos < HEADER_SIZE)
        return 0;
    const uint8_t *batch = buf + pos;
    int32_t batch_length = be32(batch + BATCH_LENGTH_AT);
    header->attributes = be16(batch + ATTRIBUTES_AT);
    header->last_offset_delta = be32(batch + LAST_OFFSET_DELTA_AT);
    header->count = be32(batch + RECORDS_COUNT_AT);
    if (batch[MAGIC_AT] != MAGIC || batch_length < MIN_BATCH_LENGTH ||
        (int64_t)batch_length + LOG_OVERHEAD > end - pos || header->count < 0 ||
        header->last_offset_delta < 0 || (header->attributes & COMPRESSION_MASK) > LAST_CODEC)
        return 0;
    header->size = (Py_ssize_t)batch_length + LOG_OVERHEAD;
    header->base_offset = be64(batch);
    header->leader_epoch = be32(batch + LEADER_EPOCH_AT);
    header->base_timestamp = be64(batch + BASE_TIMESTAMP_AT);
    header->max_timestamp = be64(batch + MAX_TIMESTAMP_AT);
    return 1;
}

/* The checks of read_header, verify_crc and scan_records for an uncompressed batch at
 * buf[pos:], which must end by `end`. 1 with the fields filled in when the batch passes,
 * 0 when it does not (or is compressed), -1 with an exception set. */
static int check_one(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, int dense,
                     int64_t fields[10])
{
    BatchHeader header;
    if (!read_header(buf, pos, end, &header) || (header.attributes & COMPRESSION_MASK) != 0)
        return 0;
    const uint8_t *batch = buf + pos;
    int crc_ok = crc_matches(batch + ATTRIBUTES_AT, header.size - ATTRIBUTES_AT,
                             (uint32_t)load_be(batch + CRC_AT, 4));
    if (crc_ok != 1)
        return crc_ok;
    int64_t min_delta, max_delta;
    if (scan_area(buf, pos + HEADER_SIZE, pos + header.size, header.count, dense, 0,
                  &min_delta, &max_delta) != 0)
        return 0;
    fields[0] = header.size;
    fields[1] = header.base_offset;
    fields[2] = header.leader_epoch;
    fields[3] = header.attributes;
    fields[4] = header.last_offset_delta;
    fields[5] = header.base_timestamp;
    fields[6] = header.max_timestamp;
    fields[7] = header.count;
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

/* One output buffer of record_columns: a bytes object allocated once at a bound of what
 * it will hold, then shrunk to what was written (a realloc that gives the tail back
 * without copying), which Arrow wraps as it is. */
typedef struct {
    PyObject *bytes;
    Py_ssize_t size, capacity;
} Out;

static int out_new(Out *out, Py_ssize_t capacity)
{
    out->bytes = PyBytes_FromStringAndSize(NULL, capacity);
    out->size = 0;
    out->capacity = capacity;
    return out->bytes == NULL ? -1 : 0;
}

static inline uint8_t *out_data(Out *out) { return (uint8_t *)PyBytes_AS_STRING(out->bytes); }

/* Append `length` bytes. The bounds make an overflow a bug, still checked: a compare per
 * write is cheap next to the memory it guards. */
static inline int out_put(Out *out, const void *bytes, Py_ssize_t length)
{
    if (length > out->capacity - out->size) {
        PyErr_SetString(PyExc_SystemError, "record_columns: an output buffer passed its bound");
        return -1;
    }
    memcpy(out_data(out) + out->size, bytes, (size_t)length);
    out->size += length;
    return 0;
}

/* The bytes written, as a new reference; the Out gives it up. */
static PyObject *out_take(Out *out)
{
    if (_PyBytes_Resize(&out->bytes, out->size) != 0)
        return NULL; /* it freed the bytes and set MemoryError */
    PyObject *bytes = out->bytes;
    out->bytes = NULL;
    return bytes;
}

/* A nullable binary column: validity bitmap (bit i of byte i / 8, least significant
 * first), int32 offsets starting at 0, data. */
typedef struct {
    Out valid, offsets, data;
    Py_ssize_t count, nulls;
} Column;

static int column_new(Column *column, Py_ssize_t entries, Py_ssize_t data_bytes)
{
    if (out_new(&column->valid, (entries + 7) / 8) != 0 ||
        out_new(&column->offsets, 4 * (entries + 1)) != 0 ||
        out_new(&column->data, data_bytes) != 0)
        return -1;
    int32_t zero = 0;
    return out_put(&column->offsets, &zero, 4);
}

/* Append one entry, null for length -1. The data fits in int32 offsets: record_columns
 * refuses more than 2 GiB of records up front. */
static int column_put(Column *column, const uint8_t *bytes, int64_t length)
{
    if (length >= 0 && out_put(&column->data, bytes, (Py_ssize_t)length) != 0)
        return -1;
    int32_t end = (int32_t)column->data.size;
    if (out_put(&column->offsets, &end, 4) != 0)
        return -1; /* so `count` stays below the bitmap's bound */
    Py_ssize_t index = column->count++;
    uint8_t *valid = out_data(&column->valid) + index / 8;
    if (index % 8 == 0)
        *valid = 0; /* each bitmap byte is cleared as it is reached, not all up front */
    if (length >= 0)
        *valid |= (uint8_t)(1u << (index % 8));
    else
        column->nulls++;
    return 0;
}

/* (valid, offsets, data, null count), the column's buffers given up. */
static PyObject *column_take(Column *column)
{
    column->valid.size = (column->count + 7) / 8;
    return Py_BuildValue("(NNNn)", out_take(&column->valid), out_take(&column->offsets),
                         out_take(&column->data), column->nulls);
}

static void column_free(Column *column)
{
    Py_CLEAR(column->valid.bytes);
    Py_CLEAR(column->offsets.bytes);
    Py_CLEAR(column->data.bytes);
}

/* What record_columns lays out: a row per record, and with headers a list column of
 * (name, value) entries. */
typedef struct {
    Out offsets, timestamps, types, header_bounds;
    Column keys, values, names, header_values;
    Py_ssize_t rows;
    int with_headers;
} Columns;

/* Buffers for at most `rows` rows taking at most `bytes` bytes of records areas: keys,
 * values, header names and header values each fit in the areas, and every header entry
 * takes at least 2 bytes of them (its two lengths). */
static int columns_new(Columns *columns, Py_ssize_t rows, Py_ssize_t bytes)
{
    if (out_new(&columns->offsets, 8 * rows) != 0 ||
        out_new(&columns->timestamps, 8 * rows) != 0 ||
        out_new(&columns->types, 4 * rows) != 0 ||
        column_new(&columns->keys, rows, bytes) != 0 ||
        column_new(&columns->values, rows, bytes) != 0)
        return -1;
    if (!columns->with_headers)
        return 0;
    if (out_new(&columns->header_bounds, 4 * (rows + 1)) != 0 ||
        column_new(&columns->names, bytes / 2, bytes) != 0 ||
        column_new(&columns->header_values, bytes / 2, bytes) != 0)
        return -1;
    int32_t zero = 0;
    return out_put(&columns->header_bounds, &zero, 4);
}

static void columns_free(Columns *columns)
{
    Py_CLEAR(columns->offsets.bytes);
    Py_CLEAR(columns->timestamps.bytes);
    Py_CLEAR(columns->types.bytes);
    Py_CLEAR(columns->header_bounds.bytes);
    column_free(&columns->keys);
    column_free(&columns->values);
    column_free(&columns->names);
    column_free(&columns->header_values);
}

/* (rows, offsets, timestamps, types, keys, values, headers or None): see record_columns. */
static PyObject *columns_take(Columns *columns)
{
    PyObject *headers = Py_None;
    if (columns->with_headers)
        headers = Py_BuildValue("(NNN)", out_take(&columns->header_bounds),
                                column_take(&columns->names),
                                column_take(&columns->header_values));
    else
        Py_INCREF(Py_None);
    if (headers == NULL)
        return NULL;
    return Py_BuildValue("(nNNNNNN)", columns->rows, out_take(&columns->offsets),
                         out_take(&columns->timestamps), out_take(&columns->types),
                         column_take(&columns->keys), column_take(&columns->values), headers);
}

enum { TAKEN = 0, DECLINED = 1, FAILED = -1 };

/* Two's complement addition: a corrupt or absurd record's offset or timestamp wraps (as
 * it always has here) rather than failing the read. */
static inline int64_t wrapping_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

/* Lay out the `count` records filling area[0:end] of the batch `header` whose offsets lie
 * in [lower, upper): TAKEN, DECLINED when a record does not decode (batch.decode_records
 * then says why), or FAILED with an exception set. Under LogAppendTime every record takes
 * the batch's max timestamp, as Kafka defines. */
static int put_area(Columns *columns, const uint8_t *buf, Py_ssize_t end,
                    const BatchHeader *header, int64_t lower, int64_t upper)
{
    int32_t timestamp_type = (header->attributes & TIMESTAMP_TYPE_FLAG) != 0;
    Py_ssize_t pos = 0;
    for (int32_t index = 0; index < header->count; index++) {
        int64_t length, ts_delta, offset_delta, key_length, value_length, header_count;
        if (read_varint(buf, &pos, end, VARINT_MAX, &length) != 0 || length < 6 ||
            length > end - pos)
            return DECLINED;
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        if (read_varint(buf, &pos, record_end, VARLONG_MAX, &ts_delta) != 0 ||
            read_varint(buf, &pos, record_end, VARINT_MAX, &offset_delta) != 0 ||
            read_varint(buf, &pos, record_end, VARINT_MAX, &key_length) != 0 ||
            key_length < -1 || key_length > record_end - pos)
            return DECLINED;
        Py_ssize_t key_at = pos;
        pos += key_length > 0 ? (Py_ssize_t)key_length : 0;
        if (read_varint(buf, &pos, record_end, VARINT_MAX, &value_length) != 0 ||
            value_length < -1 || value_length > record_end - pos)
            return DECLINED;
        Py_ssize_t value_at = pos;
        pos += value_length > 0 ? (Py_ssize_t)value_length : 0;
        if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_count) != 0 ||
            header_count < 0 || header_count > record_end - pos)
            return DECLINED;
        int64_t offset = wrapping_add(header->base_offset, offset_delta);
        int keep = offset >= lower && offset < upper;
        for (int64_t h = 0; h < header_count; h++) {
            int64_t name_length, header_length;
            if (read_varint(buf, &pos, record_end, VARINT_MAX, &name_length) != 0 ||
                name_length < 0 || name_length > record_end - pos)
                return DECLINED;
            Py_ssize_t name_at = pos;
            pos += (Py_ssize_t)name_length;
            if (read_varint(buf, &pos, record_end, VARINT_MAX, &header_length) != 0 ||
                header_length < -1 || header_length > record_end - pos)
                return DECLINED;
            Py_ssize_t header_at = pos;
            pos += header_length > 0 ? (Py_ssize_t)header_length : 0;
            if (keep && columns->with_headers &&
                (column_put(&columns->names, buf + name_at, name_length) != 0 ||
                 column_put(&columns->header_values, buf + header_at, header_length) != 0))
                return FAILED;
        }
        if (pos != record_end)
            return DECLINED;
        if (!keep)
            continue;
        int64_t timestamp = timestamp_type ? header->max_timestamp
                                           : wrapping_add(header->base_timestamp, ts_delta);
        int64_t micros = (int64_t)((uint64_t)timestamp * 1000u);
        int32_t header_end = (int32_t)columns->names.count;
        if (out_put(&columns->offsets, &offset, 8) != 0 ||
            out_put(&columns->timestamps, &micros, 8) != 0 ||
            out_put(&columns->types, &timestamp_type, 4) != 0 ||
            column_put(&columns->keys, buf + key_at, key_length) != 0 ||
            column_put(&columns->values, buf + value_at, value_length) != 0 ||
            (columns->with_headers && out_put(&columns->header_bounds, &header_end, 4) != 0))
            return FAILED;
        columns->rows++;
    }
    return pos == end ? TAKEN : DECLINED;
}

/* A walk over the whole batches of a fetched records blob, as fetch._columns walked them
 * in Python: a trailing partial batch (what a fetch answer may end with) ends it, and so
 * does the first batch whose next offset reaches `upper`. */
typedef struct {
    const uint8_t *buf;
    Py_ssize_t pos, end;
    int64_t upper;
    int64_t next; /* the offset to fetch after the batches walked so far */
    int done;
} Walk;

/* The next batch with records to take (neither a control batch nor empty): 1 with its
 * header and position, 0 at the walk's end, -1 for a header that does not pass. */
static int walk_next(Walk *walk, BatchHeader *header, Py_ssize_t *at)
{
    while (!walk->done && walk->end - walk->pos >= LOG_OVERHEAD) {
        Py_ssize_t pos = walk->pos;
        int64_t size = (int64_t)be32(walk->buf + pos + BATCH_LENGTH_AT) + LOG_OVERHEAD;
        if (size > walk->end - pos && size >= HEADER_SIZE)
            return 0;
        if (!read_header(walk->buf, pos, walk->end, header))
            return -1;
        int64_t batch_next;
        if (__builtin_add_overflow(header->base_offset, (int64_t)header->last_offset_delta + 1,
                                   &batch_next))
            batch_next = INT64_MAX; /* a corrupt header: past any end */
        if (batch_next > walk->next)
            walk->next = batch_next;
        walk->pos += header->size;
        walk->done = batch_next >= walk->upper;
        if (!(header->attributes & CONTROL_FLAG) && header->count > 0) {
            *at = pos;
            return 1;
        }
    }
    return 0;
}

/* The records area of the batch at `at` into `area`: its bytes in the blob, or, compressed,
 * its inflated records from `inflated` ({position: buffer}). 1 with `area` to release,
 * 0 when `inflated` lacks it, -1 with an exception set. */
static int get_area(Py_buffer *blob, PyObject *inflated, Py_ssize_t at,
                    const BatchHeader *header, Py_buffer *area)
{
    if ((header->attributes & COMPRESSION_MASK) == 0)
        return PyBuffer_FillInfo(area, NULL, (uint8_t *)blob->buf + at + HEADER_SIZE,
                                 header->size - HEADER_SIZE, 1, PyBUF_SIMPLE) == 0 ? 1 : -1;
    PyObject *key = PyLong_FromSsize_t(at);
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(inflated, key);
    Py_DECREF(key);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyObject_GetBuffer(found, area, PyBUF_SIMPLE) == 0 ? 1 : -1;
}

/* record_columns(records, lower, upper, headers, inflated) -> (next_offset, columns or
 * None), a list of positions, or None.
 *
 * `records` holds whole record batches (a fetch answer's, which may end with a partial
 * one). Walking them as fetch._columns did (see Walk; control and empty batches are
 * skipped), the records with offsets in [lower, upper) become rows: offsets int64,
 * timestamps int64 microseconds, types int32, keys and values nullable binary columns as
 * (valid, offsets, data, null count), and, when `headers`, a list column as (list offsets,
 * names, values). Columns is (rows, offsets, timestamps, types, keys, values, headers or
 * None), or None when no record is in range; next_offset is the offset to fetch next.
 *
 * Compressed batches need the Python codecs: their inflated records come in `inflated`,
 * {batch position: buffer}. A list is the positions of those the walk needs and
 * `inflated` lacks: call again with them. None when a header or record does not pass
 * (batch.read_header and decode_records then say why).
 *
 * A first walk over the headers bounds the rows (the batches' record counts) and the
 * bytes (their areas'), so each output buffer is allocated once; a second lays out. */
static PyObject *record_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record_columns takes 5 arguments");
        return NULL;
    }
    int64_t lower = PyLong_AsLongLong(args[1]), upper = PyLong_AsLongLong(args[2]);
    int with_headers = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || with_headers < 0)
        return NULL;
    PyObject *inflated = args[4];
    if (!PyDict_Check(inflated)) {
        PyErr_SetString(PyExc_TypeError, "record_columns: inflated must be a dict");
        return NULL;
    }
    Py_buffer blob;
    if (PyObject_GetBuffer(args[0], &blob, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL, *missing = NULL;
    Columns columns = {.with_headers = with_headers};
    Walk walk = {.buf = blob.buf, .end = blob.len, .upper = upper, .next = lower};
    BatchHeader header;
    Py_buffer area;
    Py_ssize_t at, rows = 0, bytes = 0;
    int found;
    while ((found = walk_next(&walk, &header, &at)) == 1) {
        rows += header.count;
        int got = get_area(&blob, inflated, at, &header, &area);
        if (got == 1) {
            bytes += area.len;
            PyBuffer_Release(&area);
            continue;
        }
        PyObject *position = got == 0 ? PyLong_FromSsize_t(at) : NULL;
        if (position == NULL || (missing == NULL && (missing = PyList_New(0)) == NULL) ||
            PyList_Append(missing, position) != 0) {
            Py_XDECREF(position);
            goto done;
        }
        Py_DECREF(position);
    }
    if (found < 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (missing != NULL) {
        result = Py_NewRef(missing);
        goto done;
    }
    if (bytes > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "record_columns: over 2 GiB of records");
        goto done;
    }
    if (rows == 0) {
        result = Py_BuildValue("(LO)", (long long)walk.next, Py_None);
        goto done;
    }
    if (columns_new(&columns, rows, bytes) != 0)
        goto done;
    int64_t next = walk.next;
    walk = (Walk){.buf = blob.buf, .end = blob.len, .upper = upper, .next = lower};
    int taken = TAKEN;
    while (taken == TAKEN && walk_next(&walk, &header, &at) == 1) {
        if (get_area(&blob, inflated, at, &header, &area) != 1) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_SystemError, "record_columns: a batch went missing");
            goto done;
        }
        taken = put_area(&columns, area.buf, area.len, &header, lower, upper);
        PyBuffer_Release(&area);
    }
    if (taken == FAILED)
        goto done;
    if (taken == DECLINED)
        result = Py_NewRef(Py_None);
    else if (columns.rows == 0)
        result = Py_BuildValue("(LO)", (long long)next, Py_None);
    else
        result = Py_BuildValue("(LN)", (long long)next, columns_take(&columns));
done:
    Py_XDECREF(missing);
    columns_free(&columns);
    PyBuffer_Release(&blob);
    return result;
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
     "record_columns(records, lower, upper, headers, inflated) -> (next_offset, Arrow "
     "column buffers of the records with offsets in [lower, upper) or None), the positions "
     "of compressed batches to inflate, or None when a batch does not decode"},
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
