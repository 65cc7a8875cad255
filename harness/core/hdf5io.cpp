#include "hdf5io.h"

#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace attncheck {

namespace {

// Datasets smaller than this are stored contiguous (chunking + gzip only costs bytes there).
constexpr size_t kChunkThresholdBytes = 4096;
// Chunks aim at about this many bytes: big enough to compress well, small enough to read.
constexpr size_t kChunkTargetBytes = 256 * 1024;
constexpr unsigned kGzipLevel = 4;

void silence_hdf5_errors() {
  // Per call, not once: the setting is per thread in thread-safe builds.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// The innermost description on HDF5's error stack ("truncated file: eof = ..."), then cleared.
std::string hdf5_detail() {
  std::vector<std::string> descs;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
        if (err->desc && *err->desc)
          static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
        return 0;
      },
      &descs);
  H5Eclear2(H5E_DEFAULT);
  if (descs.empty()) return "";
  std::string s = descs.back();
  if (descs.size() > 1 && descs.front() != s) s = descs.front() + ": " + s;
  return s;
}

std::string where(const std::filesystem::path& file, const std::string& object) {
  std::string s = "HDF5 file '" + file.string() + "'";
  if (!object.empty()) s += ", object '" + object + "'";
  return s;
}

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& object,
                       const std::string& what, bool with_hdf5_detail = true) {
  std::string msg = where(file, object) + ": " + what;
  if (with_hdf5_detail) {
    const std::string d = hdf5_detail();
    if (!d.empty()) msg += " (HDF5: " + d + ")";
  }
  throw std::runtime_error(msg);
}

// An HDF5 identifier closed by its own close function.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Checked wrappers: a negative id or status becomes an exception naming file and object.
struct Ctx {
  const std::filesystem::path& file;
  std::string object;
  Handle check(hid_t id, herr_t (*close)(hid_t), const std::string& what) const {
    if (id < 0) fail(file, object, what);
    return Handle(id, close);
  }
  void check(herr_t status, const std::string& what) const {
    if (status < 0) fail(file, object, what);
  }
};

std::string normalize(const std::string& object) {
  if (object.empty() || object == "/") return "/";
  std::string s = object.front() == '/' ? object : "/" + object;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::vector<std::string> components(const std::string& object) {
  std::vector<std::string> parts;
  const std::string s = normalize(object);
  size_t i = 1;
  while (i < s.size()) {
    const size_t j = s.find('/', i);
    const size_t end = j == std::string::npos ? s.size() : j;
    if (end > i) parts.push_back(s.substr(i, end - i));
    i = end + 1;
  }
  return parts;
}

// Storage of a dtype in the file: the HDF5 file type, the memory type, and whether the values
// are raw bits of a format HDF5 1.10 cannot describe (bf16, f16, fp8).
struct Storage5 {
  hid_t file_type;
  hid_t mem_type;
  bool raw_bits;
};

Storage5 storage_of(DType t) {
  switch (t) {
    case DType::f64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, false};
    case DType::f32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, false};
    case DType::f16:
    case DType::bf16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16, true};
    case DType::e4m3fn:
    case DType::e4m3fnuz:
    case DType::e5m2:
    case DType::e5m2fnuz:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8, true};
    case DType::i8:
      return {H5T_STD_I8LE, H5T_NATIVE_INT8, false};
    case DType::u8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8, false};
    case DType::i32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32, false};
    case DType::i64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64, false};
  }
  throw std::logic_error("storage_of: unknown dtype");
}

// "float32", "uint16", ... for messages and for inferring a dtype without the attribute.
std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  switch (cls) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_STRING:
      return "string";
    default:
      return "HDF5 type class " + std::to_string(static_cast<int>(cls));
  }
}

std::optional<DType> dtype_from_native(const std::string& type) {
  if (type == "float64") return DType::f64;
  if (type == "float32") return DType::f32;
  if (type == "int8") return DType::i8;
  if (type == "uint8") return DType::u8;
  if (type == "int32") return DType::i32;
  if (type == "int64") return DType::i64;
  return std::nullopt;  // uint16 could be bf16 or f16: the attribute must say
}

std::string storage_type_name(DType t) {
  switch (t) {
    case DType::f64:
      return "float64";
    case DType::f32:
      return "float32";
    case DType::f16:
    case DType::bf16:
      return "uint16";
    case DType::i8:
      return "int8";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    default:
      return "uint8";
  }
}

std::string shape_string(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// Chunk dims: the full shape, leading dimensions halved until a chunk is near the target size.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t elem_size) {
  std::vector<hsize_t> c = dims;
  auto bytes = [&] {
    size_t n = elem_size;
    for (auto d : c) n *= static_cast<size_t>(d);
    return n;
  };
  for (size_t d = 0; d < c.size() && bytes() > kChunkTargetBytes; ++d) {
    while (c[d] > 1 && bytes() > kChunkTargetBytes) c[d] = (c[d] + 1) / 2;
  }
  return c;
}

// H5I_GROUP or H5I_DATASET (or another kind) of an existing object.
H5I_type_t object_kind(const Ctx& ctx, hid_t file, const std::string& object) {
  Handle obj = ctx.check(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose,
                         "cannot open '" + object + "'");
  return H5Iget_type(obj.get());
}

// Access properties: no file locking where the file system lacks it (NFS, some overlays); our
// writers never share a file (temporary name + rename), so locks protect nothing.
Handle access_properties(const Ctx& ctx) {
  Handle fapl = ctx.check(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create access properties");
#if H5_VERSION_GE(1, 10, 7)
  ctx.check(H5Pset_file_locking(fapl.get(), false, true), "cannot configure file locking");
#endif
  return fapl;
}

Handle string_type(const Ctx& ctx) {
  Handle t = ctx.check(H5Tcopy(H5T_C_S1), H5Tclose, "cannot copy the string type");
  ctx.check(H5Tset_size(t.get(), H5T_VARIABLE), "cannot make a variable-length string type");
  ctx.check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "cannot set UTF-8 on the string type");
  return t;
}

}  // namespace

H5File H5File::create(const std::filesystem::path& path) {
  silence_hdf5_errors();
  H5File f;
  f.path_ = path;
  f.writable_ = true;
  f.staged_ = std::make_unique<StagedFile>(path);
  const Handle fapl = access_properties(Ctx{path, ""});
  const std::string tmp = f.staged_->temp_path().string();
  const hid_t id = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) fail(path, "", "cannot create temporary file '" + tmp + "'");
  f.file_id_ = id;
  return f;
}

H5File H5File::open(const std::filesystem::path& path) {
  silence_hdf5_errors();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(path, "", std::filesystem::exists(path, ec) ? "not a regular file" : "no such file",
         false);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    fail(path, "", "not an HDF5 file (no valid superblock; garbage or truncated)");
  const Handle fapl = access_properties(Ctx{path, ""});
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) fail(path, "", "cannot open (corrupt or truncated file?)");
  H5File f;
  f.path_ = path;
  f.file_id_ = id;
  f.writable_ = false;
  return f;
}

H5File::H5File(H5File&& o) noexcept
    : path_(std::move(o.path_)),
      staged_(std::move(o.staged_)),
      file_id_(std::exchange(o.file_id_, -1)),
      writable_(o.writable_) {}

H5File& H5File::operator=(H5File&& o) noexcept {
  if (this != &o) {
    close_quietly();
    path_ = std::move(o.path_);
    staged_ = std::move(o.staged_);
    file_id_ = std::exchange(o.file_id_, -1);
    writable_ = o.writable_;
  }
  return *this;
}

H5File::~H5File() {
  close_quietly();
}

void H5File::close_quietly() noexcept {
  if (file_id_ < 0) return;
  H5Fclose(file_id_);
  H5Eclear2(H5E_DEFAULT);
  file_id_ = -1;
  if (staged_) staged_->discard();  // never committed: the temporary file must not survive
}

int64_t H5File::require_open(const char* what) const {
  if (file_id_ < 0)
    throw std::runtime_error(where(path_, "") + ": " + what + " on a closed (or committed) file");
  return file_id_;
}

void H5File::require_writable(const char* what) const {
  require_open(what);
  if (!writable_)
    throw std::runtime_error(where(path_, "") + ": " + what + " on a file opened read-only");
}

void H5File::commit() {
  require_writable("commit");
  const hid_t id = std::exchange(file_id_, -1);
  const bool flushed = H5Fflush(id, H5F_SCOPE_GLOBAL) >= 0;
  const bool closed = H5Fclose(id) >= 0;
  if (!flushed || !closed) {
    const std::string d = hdf5_detail();
    staged_->discard();
    throw std::runtime_error(where(path_, "") + ": cannot flush and close the temporary file" +
                             (d.empty() ? "" : " (HDF5: " + d + ")"));
  }
  // fsync, the target checked again (missing or a regular file), rename, directory fsync.
  staged_->commit();
}

void H5File::create_group(const std::string& group) {
  require_writable("create_group");
  const Ctx ctx{path_, normalize(group)};
  std::string prefix;
  for (const auto& part : components(group)) {
    prefix += "/" + part;
    const htri_t exists = H5Lexists(file_id_, prefix.c_str(), H5P_DEFAULT);
    if (exists < 0) fail(path_, prefix, "cannot look up the link");
    if (exists > 0) {
      if (object_kind(ctx, file_id_, prefix) != H5I_GROUP)
        fail(path_, prefix, "exists and is not a group", false);
      continue;
    }
    Handle gcpl = ctx.check(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, "cannot create properties");
    ctx.check(H5Pset_obj_track_times(gcpl.get(), false), "cannot disable time tracking");
    ctx.check(H5Gcreate2(file_id_, prefix.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose,
              "cannot create group '" + prefix + "'");
  }
}

bool H5File::has(const std::string& object) const {
  require_open("has");
  std::string prefix;
  const auto parts = components(object);
  for (size_t i = 0; i < parts.size(); ++i) {
    // "/a/b" below a dataset "/a" does not exist (HDF5 would report an error instead).
    if (i > 0 && object_kind(Ctx{path_, prefix}, file_id_, prefix) != H5I_GROUP) return false;
    prefix += "/" + parts[i];
    const htri_t exists = H5Lexists(file_id_, prefix.c_str(), H5P_DEFAULT);
    if (exists < 0) fail(path_, prefix, "cannot look up the link");
    if (exists == 0) return false;
  }
  if (prefix.empty()) return true;  // the root group
  // A dangling soft link exists as a link but not as an object.
  const htri_t obj = H5Oexists_by_name(file_id_, prefix.c_str(), H5P_DEFAULT);
  if (obj < 0) fail(path_, prefix, "cannot look up the object");
  return obj > 0;
}

bool H5File::is_dataset(const std::string& object) const {
  if (!has(object)) return false;
  const std::string o = normalize(object);
  return object_kind(Ctx{path_, o}, file_id_, o) == H5I_DATASET;
}

std::vector<std::string> H5File::children(const std::string& group) const {
  require_open("children");
  const std::string g = normalize(group);
  if (!has(g)) fail(path_, g, "no such group", false);
  const Ctx ctx{path_, g};
  Handle gid =
      ctx.check(H5Gopen2(file_id_, g.c_str(), H5P_DEFAULT), H5Gclose, "cannot open as a group");
  H5G_info_t info;
  ctx.check(H5Gget_info(gid.get(), &info), "cannot read group info");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n =
        H5Lget_name_by_idx(gid.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) fail(path_, g, "cannot read a link name");
    std::string name(static_cast<size_t>(n), '\0');
    ctx.check(static_cast<herr_t>(H5Lget_name_by_idx(gid.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i,
                                                     name.data(), name.size() + 1, H5P_DEFAULT)),
              "cannot read a link name");
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

void H5File::write_tensor(const std::string& dataset, const Tensor& t) {
  require_writable("write_tensor");
  const std::string d = normalize(dataset);
  const Ctx ctx{path_, d};
  if (!t.defined()) fail(path_, d, "cannot write an undefined tensor", false);
  if (d == "/") fail(path_, d, "a dataset needs a name", false);
  if (has(d)) fail(path_, d, "already exists", false);
  const size_t slash = d.rfind('/');
  if (slash > 0) create_group(d.substr(0, slash));

  const Storage5 st = storage_of(t.dtype());
  std::vector<hsize_t> dims;
  for (auto n : t.shape()) dims.push_back(static_cast<hsize_t>(n));
  Handle space =
      dims.empty()
          ? ctx.check(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace")
          : ctx.check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                      H5Sclose, "cannot create a dataspace");
  Handle dcpl = ctx.check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "cannot create properties");
  ctx.check(H5Pset_obj_track_times(dcpl.get(), false), "cannot disable time tracking");
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!dims.empty() && bytes >= kChunkThresholdBytes) {
    const auto chunk = chunk_dims(dims, t.element_size());
    ctx.check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()),
              "cannot set chunking");
    ctx.check(H5Pset_shuffle(dcpl.get()), "cannot set the shuffle filter");
    ctx.check(H5Pset_deflate(dcpl.get(), kGzipLevel), "cannot set gzip compression");
  }
  Handle did = ctx.check(H5Dcreate2(file_id_, d.c_str(), st.file_type, space.get(), H5P_DEFAULT,
                                    dcpl.get(), H5P_DEFAULT),
                         H5Dclose, "cannot create the dataset");
  if (bytes > 0) {
    const Tensor c = t.is_contiguous() ? t : t.contiguous();
    ctx.check(H5Dwrite(did.get(), st.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data()),
              "cannot write the data");
  }
  did.reset();
  set_attr(d, "dtype", dtype_name(t.dtype()));
  if (st.raw_bits) set_attr(d, "encoding", "raw_bits");
}

DType H5File::dataset_dtype(const std::string& dataset) const {
  require_open("dataset_dtype");
  const std::string d = normalize(dataset);
  if (!is_dataset(d)) fail(path_, d, has(d) ? "is not a dataset" : "no such dataset", false);
  const Ctx ctx{path_, d};
  Handle did =
      ctx.check(H5Dopen2(file_id_, d.c_str(), H5P_DEFAULT), H5Dclose, "cannot open the dataset");
  Handle type = ctx.check(H5Dget_type(did.get()), H5Tclose, "cannot read the datatype");
  const std::string stored = describe_type(type.get());
  if (!has_attr(d, "dtype")) {
    if (auto inferred = dtype_from_native(stored)) return *inferred;
    fail(path_, d, "no 'dtype' attribute, and stored type " + stored + " does not imply one",
         false);
  }
  const std::string name = attr_string(d, "dtype");
  const auto parsed = parse_dtype(name);
  if (!parsed) fail(path_, d, "unknown dtype attribute '" + name + "'", false);
  if (stored != storage_type_name(*parsed))
    fail(path_, d,
         "stored as " + stored + ", but dtype attribute '" + name + "' needs " +
             storage_type_name(*parsed),
         false);
  return *parsed;
}

Shape H5File::dataset_shape(const std::string& dataset) const {
  require_open("dataset_shape");
  const std::string d = normalize(dataset);
  if (!is_dataset(d)) fail(path_, d, has(d) ? "is not a dataset" : "no such dataset", false);
  const Ctx ctx{path_, d};
  Handle did =
      ctx.check(H5Dopen2(file_id_, d.c_str(), H5P_DEFAULT), H5Dclose, "cannot open the dataset");
  Handle space = ctx.check(H5Dget_space(did.get()), H5Sclose, "cannot read the dataspace");
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) fail(path_, d, "cannot read the rank");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0) ctx.check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "dims");
  Shape shape;
  for (auto n : dims) shape.push_back(static_cast<int64_t>(n));
  return shape;
}

Tensor H5File::read_tensor(const std::string& dataset) const {
  const std::string d = normalize(dataset);
  const DType dtype = dataset_dtype(d);
  const Shape shape = dataset_shape(d);
  const Ctx ctx{path_, d};
  // The extents are metadata a damaged file can declare freely: check them against what the file
  // stores before allocating (a declared-huge dataset must not allocate gigabytes first).
  uint64_t bytes = dtype_size(dtype);
  for (const int64_t n : shape)
    if (n < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(n), &bytes))
      fail(path_, d, "declares the impossible shape " + shape_string(shape), false);
  if (bytes == 0) return Tensor::empty(dtype, shape);
  Handle did =
      ctx.check(H5Dopen2(file_id_, d.c_str(), H5P_DEFAULT), H5Dclose, "cannot open the dataset");
  const uint64_t stored = H5Dget_storage_size(did.get());
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path_, ec);
  Handle dcpl = ctx.check(H5Dget_create_plist(did.get()), H5Pclose, "cannot read its properties");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  // Compact and contiguous data is stored as is; chunks at most deflate's 1032:1 (plus headers).
  const uint64_t max_ratio = layout == H5D_CHUNKED ? 1100 : 1;
  if (stored == 0 || (!ec && stored > file_bytes) || bytes / max_ratio > stored)
    fail(path_, d,
         "declares " + shape_string(shape) + " (" + std::to_string(bytes) + " bytes) but stores " +
             std::to_string(stored) + " bytes in a file of " + std::to_string(file_bytes) +
             ": damaged metadata",
         false);
  Tensor t = Tensor::empty(dtype, shape);
  ctx.check(H5Dread(did.get(), storage_of(dtype).mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()),
            "cannot read the data (corrupt or truncated file?)");
  return t;
}

Tensor H5File::read_tensor(const std::string& dataset, DType dtype, const Shape& shape) const {
  const std::string d = normalize(dataset);
  const DType got_dtype = dataset_dtype(d);
  const Shape got_shape = dataset_shape(d);
  if (got_dtype != dtype || got_shape != shape)
    fail(path_, d,
         "expected " + std::string(dtype_name(dtype)) + shape_string(shape) + ", found " +
             std::string(dtype_name(got_dtype)) + shape_string(got_shape),
         false);
  return read_tensor(d);
}

namespace {

// Opens an object and (re)creates attribute `name` of the given type; returns the attribute.
Handle recreate_attr(const Ctx& ctx, hid_t file, const std::string& object, const std::string& name,
                     hid_t type) {
  Handle obj =
      ctx.check(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose, "cannot open the object");
  const htri_t exists = H5Aexists(obj.get(), name.c_str());
  if (exists < 0) fail(ctx.file, object, "cannot look up attribute '" + name + "'");
  if (exists > 0) ctx.check(H5Adelete(obj.get(), name.c_str()), "cannot replace '" + name + "'");
  Handle space = ctx.check(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a dataspace");
  return ctx.check(H5Acreate2(obj.get(), name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose, "cannot create attribute '" + name + "'");
}

}  // namespace

void H5File::set_attr(const std::string& object, const std::string& name, std::string_view value) {
  require_writable("set_attr");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object for attribute '" + name + "'", false);
  const Ctx ctx{path_, o};
  Handle type = string_type(ctx);
  Handle attr = recreate_attr(ctx, file_id_, o, name, type.get());
  const std::string copy(value);
  const char* p = copy.c_str();
  ctx.check(H5Awrite(attr.get(), type.get(), &p), "cannot write attribute '" + name + "'");
}

void H5File::set_attr(const std::string& object, const std::string& name, int64_t value) {
  require_writable("set_attr");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object for attribute '" + name + "'", false);
  const Ctx ctx{path_, o};
  Handle attr = recreate_attr(ctx, file_id_, o, name, H5T_STD_I64LE);
  ctx.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value),
            "cannot write attribute '" + name + "'");
}

void H5File::set_attr(const std::string& object, const std::string& name, double value) {
  require_writable("set_attr");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object for attribute '" + name + "'", false);
  const Ctx ctx{path_, o};
  Handle attr = recreate_attr(ctx, file_id_, o, name, H5T_IEEE_F64LE);
  ctx.check(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value),
            "cannot write attribute '" + name + "'");
}

void H5File::set_attr_json(const std::string& object, const std::string& name,
                           const nlohmann::json& value) {
  set_attr(object, name, value.dump());
}

bool H5File::has_attr(const std::string& object, const std::string& name) const {
  require_open("has_attr");
  const std::string o = normalize(object);
  if (!has(o)) return false;
  const htri_t exists = H5Aexists_by_name(file_id_, o.c_str(), name.c_str(), H5P_DEFAULT);
  if (exists < 0) fail(path_, o, "cannot look up attribute '" + name + "'");
  return exists > 0;
}

std::vector<std::string> H5File::attr_names(const std::string& object) const {
  require_open("attr_names");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object", false);
  const Ctx ctx{path_, o};
  Handle obj =
      ctx.check(H5Oopen(file_id_, o.c_str(), H5P_DEFAULT), H5Oclose, "cannot open the object");
  std::vector<std::string> names;
  hsize_t pos = 0;
  ctx.check(H5Aiterate2(
                obj.get(), H5_INDEX_NAME, H5_ITER_INC, &pos,
                [](hid_t, const char* attr_name, const H5A_info_t*, void* data) -> herr_t {
                  static_cast<std::vector<std::string>*>(data)->emplace_back(attr_name);
                  return 0;
                },
                &names),
            "cannot list the attributes");
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

// Opens attribute `name` of `object`, which must exist and hold a single value.
Handle open_attr(const Ctx& ctx, hid_t file, const std::string& object, const std::string& name) {
  const htri_t exists = H5Aexists_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT);
  if (exists < 0) fail(ctx.file, object, "cannot look up attribute '" + name + "'");
  if (exists == 0) fail(ctx.file, object, "no attribute '" + name + "'", false);
  Handle attr =
      ctx.check(H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, "cannot open attribute '" + name + "'");
  Handle space = ctx.check(H5Aget_space(attr.get()), H5Sclose, "cannot read its dataspace");
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    fail(ctx.file, object, "attribute '" + name + "' is not a single value", false);
  return attr;
}

}  // namespace

std::string H5File::attr_string(const std::string& object, const std::string& name) const {
  require_open("attr_string");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object (reading attribute '" + name + "')", false);
  const Ctx ctx{path_, o};
  Handle attr = open_attr(ctx, file_id_, o, name);
  Handle type = ctx.check(H5Aget_type(attr.get()), H5Tclose, "cannot read the attribute type");
  if (H5Tget_class(type.get()) != H5T_STRING)
    fail(path_, o, "attribute '" + name + "' is " + describe_type(type.get()) + ", not a string",
         false);
  const htri_t vlen = H5Tis_variable_str(type.get());
  if (vlen < 0) fail(path_, o, "cannot inspect attribute '" + name + "'");
  if (vlen > 0) {
    Handle mem = string_type(ctx);
    char* p = nullptr;
    ctx.check(H5Aread(attr.get(), mem.get(), &p), "cannot read attribute '" + name + "'");
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  // Fixed-length (e.g. written by h5py from numpy bytes): may be NUL-padded.
  const size_t size = H5Tget_size(type.get());
  std::string s(size, '\0');
  Handle mem = ctx.check(H5Tcopy(type.get()), H5Tclose, "cannot copy the string type");
  ctx.check(H5Aread(attr.get(), mem.get(), s.data()), "cannot read attribute '" + name + "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t H5File::attr_int(const std::string& object, const std::string& name) const {
  require_open("attr_int");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object (reading attribute '" + name + "')", false);
  const Ctx ctx{path_, o};
  Handle attr = open_attr(ctx, file_id_, o, name);
  Handle type = ctx.check(H5Aget_type(attr.get()), H5Tclose, "cannot read the attribute type");
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    fail(path_, o, "attribute '" + name + "' is " + describe_type(type.get()) + ", not an integer",
         false);
  int64_t v = 0;
  ctx.check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "cannot read attribute '" + name + "'");
  return v;
}

double H5File::attr_double(const std::string& object, const std::string& name) const {
  require_open("attr_double");
  const std::string o = normalize(object);
  if (!has(o)) fail(path_, o, "no such object (reading attribute '" + name + "')", false);
  const Ctx ctx{path_, o};
  Handle attr = open_attr(ctx, file_id_, o, name);
  Handle type = ctx.check(H5Aget_type(attr.get()), H5Tclose, "cannot read the attribute type");
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    fail(path_, o, "attribute '" + name + "' is " + describe_type(type.get()) + ", not a number",
         false);
  double v = 0;
  ctx.check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), "cannot read attribute '" + name + "'");
  return v;
}

nlohmann::json H5File::attr_json(const std::string& object, const std::string& name) const {
  const std::string s = attr_string(object, name);
  try {
    return nlohmann::json::parse(s);
  } catch (const nlohmann::json::exception& e) {
    fail(path_, normalize(object), "attribute '" + name + "' is not JSON: " + e.what(), false);
  }
}

void require_replaceable(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw std::runtime_error("'" + path.string() + "': cannot inspect: " + std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  throw std::runtime_error("refusing to replace '" + path.string() + "': it is " + kind +
                           " (only missing paths and regular files are written)");
}

namespace {
// A pointer, so that a forked reader can start with a lock of its own: the caller of
// read_in_child holds this one (GoldenStore checks a file while it loads), and in the child its
// owner is a thread that does not exist there.
std::recursive_mutex* g_hdf5_mutex = new std::recursive_mutex;
}  // namespace

std::recursive_mutex& hdf5_mutex() {
  return *g_hdf5_mutex;
}

std::string read_in_child(const std::function<void()>& read, double timeout_s) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const std::string err = std::strerror(errno);
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error("fork: " + err);
  }
  if (pid == 0) {
    // The child: its own process group (killed as a whole at the timeout), and killed with its
    // parent: a reader looping in libhdf5 must not outlive a parent that was killed (a worker at
    // its case timeout, `golden verify` at kill -9). The check after prctl closes the window in
    // which the parent died before the request was made.
    g_hdf5_mutex = new std::recursive_mutex;  // one thread here; the old one is held
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    // A crash must end it by its signal (no inherited handler may treat it as its own).
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
    ::close(fds[0]);
    // Only its own pipe end stays open: readers started at once by several threads (the golden
    // checks) must not hold each other's pipes open, or one that hangs would delay the others'
    // end of file until its timeout.
    if (fds[1] != 3) {
      ::dup2(fds[1], 3);
      fds[1] = 3;
    }
    ::close_range(4, ~0u, 0);
    std::string msg = "ok";
    try {
      read();
    } catch (const std::exception& e) {
      msg = std::string("error: ") + e.what();
    } catch (...) {
      msg = "error: unknown exception";
    }
    for (size_t off = 0; off < msg.size();) {
      const ssize_t n = ::write(fds[1], msg.data() + off, msg.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);  // no atexit handlers, no flushing of the parent's buffers
  }
  ::close(fds[1]);
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a kill
  std::string msg;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child exited or closed the pipe
    msg.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(-pid, SIGKILL);  // the reader and anything it started
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    std::ostringstream os;
    os << "timed out after " << timeout_s << " s (killed)";
    return os.str();
  }
  if (WIFSIGNALED(status))
    return "crashed with signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || msg.empty())
    return "exited with status " + std::to_string(WEXITSTATUS(status)) + " before reporting";
  if (msg == "ok") return "";
  return msg.rfind("error: ", 0) == 0 ? msg.substr(7) : msg;
}

}  // namespace attncheck
