// libFuzzer target: the report's reader of a results directory (harness/report/attncheck_report/
// results.py load_runs), through an embedded CPython. The input's first line becomes run.json,
// the rest results.jsonl. A bad directory must raise ResultsError naming the file; any other
// exception is a bug (the report would end in a traceback), and aborts.
#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_util.h"

namespace {
PyObject* g_load_runs = nullptr;
PyObject* g_results_error = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Python's own arenas are mapped and unmapped at fresh addresses, and ASan keeps the shadow of
  // every address it saw: through malloc, memory stays bounded (and ASan sees Python's blocks).
  ::setenv("PYTHONMALLOC", "malloc", 1);
  Py_Initialize();
  PyObject* sys_path = PySys_GetObject("path");  // borrowed
  PyObject* dir = PyUnicode_FromString(ATTNCHECK_REPORT_DIR);
  PyList_Insert(sys_path, 0, dir);
  Py_DECREF(dir);
  PyObject* mod = PyImport_ImportModule("attncheck_report.results");
  if (!mod) {
    PyErr_Print();
    std::abort();
  }
  g_load_runs = PyObject_GetAttrString(mod, "load_runs");
  g_results_error = PyObject_GetAttrString(mod, "ResultsError");
  if (!g_load_runs || !g_results_error) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string run_json = text.substr(0, nl);
  const std::string jsonl = nl == std::string::npos ? "" : text.substr(nl + 1);
  const auto dir = attncheck::fuzz::work_dir() / "results";
  std::filesystem::create_directories(dir);
  attncheck::fuzz::write_input("results/run.json",
                               reinterpret_cast<const uint8_t*>(run_json.data()), run_json.size());
  attncheck::fuzz::write_input("results/results.jsonl",
                               reinterpret_cast<const uint8_t*>(jsonl.data()), jsonl.size());
  PyObject* arg = Py_BuildValue("([s])", dir.c_str());
  PyObject* runs = PyObject_CallObject(g_load_runs, arg);
  Py_DECREF(arg);
  if (runs) {
    Py_DECREF(runs);
    return 0;
  }
  if (PyErr_ExceptionMatches(g_results_error)) {
    PyErr_Clear();
    return 0;
  }
  PyErr_Print();  // the traceback the report would have printed
  std::abort();
}
