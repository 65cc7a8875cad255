// HDF5 files for goldens and repro bundles: a small RAII layer over the HDF5 C API (1.10).
//
// Storage rules (docs/formats.md): f64/f32/i32/i64/u8/i8 use the native HDF5 types; bf16 and f16
// are stored as uint16 raw bits, fp8 as uint8 raw bits, so h5py + numpy read every file without
// ml_dtypes. Every dataset carries a string attribute "dtype" = dtype_name() ("bf16",
// "fp8_e4m3fn", ...); raw-bit datasets also carry "encoding" = "raw_bits". Objects are written
// without modification times, so the same content gives the same file bytes.
//
// Every failure (missing, truncated or corrupt file, missing dataset or attribute, dtype or shape
// mismatch) throws std::runtime_error naming the file and the object; HDF5's own error stack is
// never printed. Not thread-safe (Debian's libhdf5 is not built thread-safe): threads of one
// process that use HDF5 hold hdf5_mutex() over every use (GoldenStore, repro bundles).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "safe_output.h"
#include "tensor.h"

namespace attncheck {

class H5File {
 public:
  // A new file written to an unpredictable temporary name next to `path` (StagedFile,
  // core/safe_output.h; parent directories are created); nothing appears at `path` until
  // commit(). Destroying it without commit() removes the temporary file.
  static H5File create(const std::filesystem::path& path);
  // An existing file, read-only.
  static H5File open(const std::filesystem::path& path);

  H5File(H5File&& other) noexcept;
  H5File& operator=(H5File&& other) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();

  // Flushes, closes, fsyncs and renames the temporary file onto path() (then fsyncs the
  // directory). The object is closed afterwards.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  bool writable() const { return writable_; }

  // Object paths are HDF5 paths: "inputs/q" and "/inputs/q" are the same; "/" is the root.
  void create_group(const std::string& group);  // creates missing parents; existing is fine
  bool has(const std::string& object) const;    // group or dataset
  bool is_dataset(const std::string& object) const;
  std::vector<std::string> children(const std::string& group = "/") const;  // names, sorted

  // Writes the logical contents of `t` (any strides, any view) as a new dataset; missing parent
  // groups are created. An existing dataset at `dataset` is an error.
  void write_tensor(const std::string& dataset, const Tensor& t);
  // Reads a dataset back into a contiguous tensor of the dtype its "dtype" attribute names (or,
  // without the attribute, the dtype its native HDF5 type implies).
  Tensor read_tensor(const std::string& dataset) const;
  // The same, and the dtype and shape must be exactly these.
  Tensor read_tensor(const std::string& dataset, DType dtype, const Shape& shape) const;
  // What read_tensor would return, without reading the data.
  DType dataset_dtype(const std::string& dataset) const;
  Shape dataset_shape(const std::string& dataset) const;

  // Scalar attributes on a group or dataset ("/" = the file). Setting replaces an existing one.
  void set_attr(const std::string& object, const std::string& name, std::string_view value);
  void set_attr(const std::string& object, const std::string& name, const std::string& value) {
    set_attr(object, name, std::string_view(value));
  }
  void set_attr(const std::string& object, const std::string& name, const char* value) {
    set_attr(object, name, std::string_view(value));
  }
  void set_attr(const std::string& object, const std::string& name, int64_t value);
  template <class I>
  requires std::is_integral_v<I>  // int, size_t, ...: stored as int64
  void set_attr(const std::string& object, const std::string& name, I value) {
    set_attr(object, name, static_cast<int64_t>(value));
  }
  void set_attr(const std::string& object, const std::string& name, double value);
  // JSON is stored as its serialized string (dump()), read back with attr_json().
  void set_attr_json(const std::string& object, const std::string& name,
                     const nlohmann::json& value);

  bool has_attr(const std::string& object, const std::string& name) const;
  std::vector<std::string> attr_names(const std::string& object) const;  // sorted
  std::string attr_string(const std::string& object, const std::string& name) const;
  int64_t attr_int(const std::string& object, const std::string& name) const;
  double attr_double(const std::string& object, const std::string& name) const;  // int or float
  nlohmann::json attr_json(const std::string& object, const std::string& name) const;

 private:
  H5File() = default;
  void close_quietly() noexcept;
  int64_t require_open(const char* what) const;
  void require_writable(const char* what) const;

  std::filesystem::path path_;          // final path
  std::unique_ptr<StagedFile> staged_;  // create(): where the data is written until commit()
  int64_t file_id_ = -1;                // hid_t
  bool writable_ = false;
};

// The process's one lock over libhdf5 (its state is global). Recursive: a locked caller may call
// another that locks.
std::recursive_mutex& hdf5_mutex();

// Runs `read` in a forked child process, so that libhdf5 crashing (SIGSEGV, SIGABRT, heap
// corruption) or looping on damaged metadata ends the child and not the caller; the child reads
// and exits, it never writes a file (and the callers hold no GPU context it could inherit). The
// child runs in a process group of its own, killed as a whole at the timeout, and dies with the
// calling thread (PR_SET_PDEATHSIG): a looping reader never outlives its parent.
// Returns "" when `read` returned, the message of the exception it threw, or what ended the child
// ("crashed with SIGSEGV (...)", "timed out after 60 s").
std::string read_in_child(const std::function<void()>& read, double timeout_s);

// Refuses to replace `path` unless it is missing or a regular file (not a directory, device,
// FIFO, socket or symbolic link): throws std::runtime_error naming the path.
void require_replaceable(const std::filesystem::path& path);

}  // namespace attncheck
