/* gateway.request.event_keys in C: the same three functions as event_keys.py, the reference
 * (its docstring says what each counts), with the same results for every region; the tests
 * hold the two to each other. Each is one METH_O call a region: the keys are found with
 * memmem, where the Python functions pay a builtin method call per search.
 * Built by `make native` (setup.py with RIDGE_COMPILE=1). See docs/gateway.md#streams. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char CONTENT[] = "content\"";
static const char REASONING[] = "\"reasoning_";
static const char TOOL_CALLS[] = "\"tool_calls\"";
static const char TEXT[] = "\"text\"";
static const char USAGE[] = "\"usage\"";
#define LEN(key) ((Py_ssize_t)(sizeof(key) - 1))

/* The index of the first byte at or after `at` that is not JSON white space. */
static Py_ssize_t space_from(const char *s, Py_ssize_t n, Py_ssize_t at) {
    while (at < n && (s[at] == ' ' || s[at] == '\n' || s[at] == '\r' || s[at] == '\t'))
        at++;
    return at;
}

/* Where the value after a key ending at `at` starts; -1 when no colon follows. */
static Py_ssize_t value_at(const char *s, Py_ssize_t n, Py_ssize_t at) {
    at = space_from(s, n, at);
    if (at == n || s[at] != ':')
        return -1;
    return space_from(s, n, at + 1);
}

/* The index of `key` in s[from:n], or -1. */
static Py_ssize_t find(const char *s, Py_ssize_t n, Py_ssize_t from, const char *key,
                       Py_ssize_t k) {
    if (from > n - k)
        return -1;
    const char *hit = memmem(s + from, (size_t)(n - from), key, (size_t)k);
    return hit == NULL ? -1 : hit - s;
}

/* How often `key` opens a non-empty string, where it starts with a quote or (p > 0) follows
 * a quote or `prefix` directly; occurrences left to right, each past the last one. */
static Py_ssize_t strings_after(const char *s, Py_ssize_t n, const char *key, Py_ssize_t k,
                                const char *prefix, Py_ssize_t p) {
    Py_ssize_t count = 0;
    for (Py_ssize_t at = find(s, n, 0, key, k); at >= 0; at = find(s, n, at + k, key, k)) {
        if (p == 0 || (at > 0 && s[at - 1] == '"') ||
                (at >= p && memcmp(s + at - p, prefix, (size_t)p) == 0)) {
            Py_ssize_t value = value_at(s, n, at + k);
            if (value >= 0 && value < n && s[value] == '"' &&
                    (value + 1 == n || s[value + 1] != '"'))
                count++;
        }
    }
    return count;
}

/* How often `key` opens an array that is not empty. */
static Py_ssize_t arrays_after(const char *s, Py_ssize_t n, const char *key, Py_ssize_t k) {
    Py_ssize_t count = 0;
    for (Py_ssize_t at = find(s, n, 0, key, k); at >= 0; at = find(s, n, at + k, key, k)) {
        Py_ssize_t value = value_at(s, n, at + k);
        if (value >= 0 && value < n && s[value] == '[') {
            Py_ssize_t inside = space_from(s, n, value + 1);
            if (inside == n || s[inside] != ']')
                count++;
        }
    }
    return count;
}

/* Points `s` and `n` at the bytes of `region`: 1, or 0 with a TypeError set (as the
 * reference raises one). */
static int bytes_of(PyObject *region, const char **s, Py_ssize_t *n) {
    if (!PyBytes_Check(region)) {
        PyErr_Format(PyExc_TypeError, "a region is bytes, not %.100s", Py_TYPE(region)->tp_name);
        return 0;
    }
    *s = PyBytes_AS_STRING(region);
    *n = PyBytes_GET_SIZE(region);
    return 1;
}

static PyObject *chat_tokens(PyObject *module, PyObject *region) {
    const char *s;
    Py_ssize_t n;
    if (!bytes_of(region, &s, &n))
        return NULL;
    return PyLong_FromSsize_t(strings_after(s, n, CONTENT, LEN(CONTENT), REASONING,
                                            LEN(REASONING)) +
                              arrays_after(s, n, TOOL_CALLS, LEN(TOOL_CALLS)));
}

static PyObject *text_tokens(PyObject *module, PyObject *region) {
    const char *s;
    Py_ssize_t n;
    if (!bytes_of(region, &s, &n))
        return NULL;
    return PyLong_FromSsize_t(strings_after(s, n, TEXT, LEN(TEXT), "", 0));
}

static PyObject *holds_usage(PyObject *module, PyObject *region) {
    const char *s;
    Py_ssize_t n;
    if (!bytes_of(region, &s, &n))
        return NULL;
    return PyBool_FromLong(find(s, n, 0, USAGE, LEN(USAGE)) >= 0);
}

static PyMethodDef methods[] = {
    {"chat_tokens", chat_tokens, METH_O,
     "How many token events a region of a chat stream holds."},
    {"text_tokens", text_tokens, METH_O,
     "How many token events a region of a completions stream holds."},
    {"holds_usage", holds_usage, METH_O, "Whether \"usage\" occurs in the region."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gateway.request.event_keys",
    "The keys a streamed region's events are read for (C; the reference is event_keys.py).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_event_keys(void) { return PyModuleDef_Init(&module); }
