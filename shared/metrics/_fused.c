/*
 * parity.shared.metrics._fused: the fused tensor-mode pass in C.
 *
 * Why C and not only numba: numba's import and cached-kernel load cost 0.4-0.7 s a process, a third of a
 * `parity compare` of 1.7 GB of tensors; this module loads in well under a millisecond. It computes exactly
 * what `numba_kernel.fused_pass` computes, in the same order (elements left to right, sums block by block,
 * float64 unless the relative error is taken in float32), so the two and the numpy pass agree bit for bit;
 * the tests hold all three equal. Built with -ffp-contract=off: a fused multiply-add would round differently.
 *
 * fused_pass(n, b, n_kind, b_kind, re_in_f32, start, stop, out) reads two 1-d buffers (any of numpy's
 * integer and float formats, or uint16 bit patterns of bfloat16/float16 by kind) over [start, stop) and
 * writes the 11 accumulators into `out`, a writable float64 buffer, with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Must equal parity.shared.metrics.tensor: KIND_*, the accumulator slots and _BLOCK (kernel.py checks). */
enum { KIND_NATIVE = 0, KIND_BF16 = 1, KIND_FP16 = 2 };
enum {
    A_DOT, A_NN, A_BB, A_DD, A_MAX_ABS, A_MAX_ABS_IDX, A_MAX_RE, A_LT1, A_LT5, A_MISMATCH,
    A_FIRST_MISMATCH, N_ACC
};
#define BLOCK 1024

/* Decodes `count` elements starting at element `i` of a strided buffer into float64. */
typedef void (*load_fn)(const char *base, Py_ssize_t stride, Py_ssize_t i, Py_ssize_t count, double *out);

#define LOADER(NAME, T)                                                                          \
    static void NAME(const char *base, Py_ssize_t stride, Py_ssize_t i, Py_ssize_t count,        \
                     double *out) {                                                              \
        if (stride == (Py_ssize_t)sizeof(T)) {                                                   \
            const T *p = (const T *)(base + i * stride);                                         \
            for (Py_ssize_t k = 0; k < count; k++) out[k] = (double)p[k];                        \
        } else {                                                                                 \
            const char *p = base + i * stride;                                                   \
            for (Py_ssize_t k = 0; k < count; k++, p += stride) out[k] = (double)*(const T *)p;  \
        }                                                                                        \
    }

LOADER(load_f32, float)
LOADER(load_f64, double)
LOADER(load_i8, int8_t)
LOADER(load_u8, uint8_t)
LOADER(load_i16, int16_t)
LOADER(load_u16, uint16_t)
LOADER(load_i32, int32_t)
LOADER(load_u32, uint32_t)
LOADER(load_i64, int64_t)
LOADER(load_u64, uint64_t)

/* The exact value of a bfloat16 bit pattern: its bits are a float32's upper half. */
static inline double bf16_value(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* The exact value of an IEEE float16 bit pattern (subnormals scaled by 2^-24, which is exact). */
static inline double fp16_value(uint16_t bits) {
    uint32_t exp = (bits >> 10) & 0x1F, man = bits & 0x3FF;
    double v;
    if (exp == 0x1F) {
        v = man ? NAN : INFINITY;
    } else if (exp == 0) {
        v = (double)man * 5.9604644775390625e-08;
    } else {
        uint64_t u = ((uint64_t)(exp + 1008) << 52) | ((uint64_t)man << 42);  /* 1008 = 1023 - 15 */
        memcpy(&v, &u, sizeof v);
    }
    return (bits & 0x8000) ? -v : v;
}

#define LOADER16(NAME, DECODE)                                                                   \
    static void NAME(const char *base, Py_ssize_t stride, Py_ssize_t i, Py_ssize_t count,        \
                     double *out) {                                                              \
        const char *p = base + i * stride;                                                       \
        for (Py_ssize_t k = 0; k < count; k++, p += stride) out[k] = DECODE(*(const uint16_t *)p); \
    }

LOADER16(load_bf16, bf16_value)
LOADER16(load_fp16, fp16_value)

/* The loader for a buffer's struct format (native byte order only) read as `kind`; NULL if unsupported. */
static load_fn loader_for(const char *format, Py_ssize_t itemsize, int kind) {
    if (format[0] == '@' || format[0] == '=' || format[0] == '<') format++;
    if (format[0] == '\0' || format[1] != '\0') return NULL;
    char c = format[0];
    if (kind == KIND_BF16 || kind == KIND_FP16) {
        if (itemsize != 2 || !(c == 'H' || c == 'h' || c == 'e')) return NULL;
        return kind == KIND_BF16 ? load_bf16 : load_fp16;
    }
    if (kind != KIND_NATIVE) return NULL;
    switch (c) {
        case 'f': return itemsize == 4 ? load_f32 : NULL;
        case 'd': return itemsize == 8 ? load_f64 : NULL;
        case '?': case 'B': return itemsize == 1 ? load_u8 : NULL;
        case 'b': return itemsize == 1 ? load_i8 : NULL;
        default: break;
    }
    int is_signed = (c == 'h' || c == 'i' || c == 'l' || c == 'q' || c == 'n');
    int is_unsigned = (c == 'H' || c == 'I' || c == 'L' || c == 'Q' || c == 'N');
    if (!is_signed && !is_unsigned) return NULL;
    switch (itemsize) {
        case 2: return is_signed ? load_i16 : load_u16;
        case 4: return is_signed ? load_i32 : load_u32;
        case 8: return is_signed ? load_i64 : load_u64;
        default: return NULL;
    }
}

typedef struct {
    double dot, nn, bb, dd, max_abs, max_re;
    Py_ssize_t max_abs_idx, first_mismatch, lt1, lt5, mismatches;
} Totals;

/* One block of decoded elements; `j0` is the index of xs[0]. The loop body is numba_kernel's, line by line. */
static void accumulate_block(const double *xs, const double *ys, Py_ssize_t count, Py_ssize_t j0,
                             int re_in_f32, Totals *t) {
    const float eps32 = FLT_EPSILON, thr1_32 = 0.001f, thr5_32 = 0.005f;
    const double eps64 = DBL_EPSILON;
    double s_dot = 0.0, s_nn = 0.0, s_bb = 0.0, s_dd = 0.0;
    for (Py_ssize_t k = 0; k < count; k++) {
        double x = xs[k], y = ys[k];
        if (!(isfinite(x) && isfinite(y))) {
            if ((isnan(x) && isnan(y)) || x == y) {
                x = 0.0;
                y = 0.0;
            } else {
                t->mismatches++;
                if (t->first_mismatch < 0) t->first_mismatch = j0 + k;
                continue;
            }
        }
        s_dot += x * y;
        s_nn += x * x;
        s_bb += y * y;
        double d = x - y;
        s_dd += d * d;
        double ad = fabs(d);
        if (ad > t->max_abs || (ad != ad && t->max_abs == t->max_abs)) {
            t->max_abs = ad;
            t->max_abs_idx = j0 + k;
        }
        double re;
        if (re_in_f32) {
            float xf = (float)x, yf = (float)y;
            if (yf == 0.0f) {
                xf = xf + eps32;
                yf = yf + eps32;
            }
            float re32 = fabsf((xf - yf) / yf);
            if (re32 < thr1_32) t->lt1++;
            if (re32 < thr5_32) t->lt5++;
            re = (double)re32;
        } else {
            double xd = x, yd = y;
            if (yd == 0.0) {
                xd = xd + eps64;
                yd = yd + eps64;
            }
            re = fabs((xd - yd) / yd);
            if (re < 0.001) t->lt1++;
            if (re < 0.005) t->lt5++;
        }
        if (re > t->max_re || (re != re && t->max_re == t->max_re)) t->max_re = re;
    }
    t->dot += s_dot;
    t->nn += s_nn;
    t->bb += s_bb;
    t->dd += s_dd;
}

static int get_input(PyObject *obj, Py_buffer *view, const char *side) {
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDED_RO | PyBUF_FORMAT) < 0) return -1;
    if (view->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "fused_pass: %s must be 1-d, not %d-d", side, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *fused_pass(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *n_obj, *b_obj, *out_obj;
    int n_kind, b_kind, re_in_f32;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OOiipnnO:fused_pass", &n_obj, &b_obj, &n_kind, &b_kind, &re_in_f32,
                          &start, &stop, &out_obj))
        return NULL;
    Py_buffer n, b, out;
    if (get_input(n_obj, &n, "n") < 0) return NULL;
    if (get_input(b_obj, &b, "b") < 0) {
        PyBuffer_Release(&n);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_CONTIG | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&n);
        PyBuffer_Release(&b);
        return NULL;
    }
    PyObject *result = NULL;
    load_fn load_n = loader_for(n.format, n.itemsize, n_kind);
    load_fn load_b = loader_for(b.format, b.itemsize, b_kind);
    if (load_n == NULL || load_b == NULL) {
        PyErr_Format(PyExc_TypeError, "fused_pass: unsupported element format %s (kind %d)",
                     load_n == NULL ? n.format : b.format, load_n == NULL ? n_kind : b_kind);
    } else if (strcmp(out.format, "d") != 0 || out.len < (Py_ssize_t)(N_ACC * sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "fused_pass: out must be a float64 buffer of 11 elements");
    } else if (start < 0 || stop < start || stop > n.shape[0] || stop > b.shape[0]) {
        PyErr_Format(PyExc_IndexError, "fused_pass: [%zd, %zd) is outside the buffers", start, stop);
    } else {
        Totals t = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1, -1, 0, 0, 0};
        Py_BEGIN_ALLOW_THREADS
        double xs[BLOCK], ys[BLOCK];
        for (Py_ssize_t i = start; i < stop; i += BLOCK) {
            Py_ssize_t count = stop - i < BLOCK ? stop - i : BLOCK;
            load_n((const char *)n.buf, n.strides[0], i, count, xs);
            load_b((const char *)b.buf, b.strides[0], i, count, ys);
            accumulate_block(xs, ys, count, i, re_in_f32, &t);
        }
        Py_END_ALLOW_THREADS
        double *acc = (double *)out.buf;
        acc[A_DOT] = t.dot;
        acc[A_NN] = t.nn;
        acc[A_BB] = t.bb;
        acc[A_DD] = t.dd;
        acc[A_MAX_ABS] = t.max_abs;
        acc[A_MAX_ABS_IDX] = (double)t.max_abs_idx;
        acc[A_MAX_RE] = t.max_re;
        acc[A_LT1] = (double)t.lt1;
        acc[A_LT5] = (double)t.lt5;
        acc[A_MISMATCH] = (double)t.mismatches;
        acc[A_FIRST_MISMATCH] = (double)t.first_mismatch;
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&n);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"fused_pass", fused_pass, METH_VARARGS,
     "fused_pass(n, b, n_kind, b_kind, re_in_f32, start, stop, out): the tensor-mode accumulators of "
     "n[start:stop] against b[start:stop], written into out (float64, 11 elements)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused", "The fused tensor-mode pass in C (see kernel.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fused(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0 || PyModule_AddIntConstant(m, "N_ACC", N_ACC) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
