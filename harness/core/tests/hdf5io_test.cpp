#include "core/hdf5io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/numeric.h"
#include "core/rng.h"
#include "test_util.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;
using testing_util::Contains;

// A fresh directory per test, removed afterwards.
class Hdf5IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("attncheck_h5_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path file(const std::string& name) const { return dir_ / name; }
  size_t entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }
  fs::path dir_;
};

template <class Fn>
std::string error_of(Fn&& fn) {
  return testing_util::error_of<std::runtime_error>(std::forward<Fn>(fn));
}

Tensor random_tensor(DType t, Shape shape, const std::string& name) {
  Tensor x = Tensor::empty(t, std::move(shape));
  const Rng rng("hdf5io_test", name);
  if (is_fp8(t)) {
    // Every code, including NaN codes, must survive: raw bits, not values.
    x.for_each_index(
        [&](const Index& idx, int64_t lin) { x.set_bits(idx, rng.block(lin)[0] & 0xFFu); });
  } else if (is_floating(t)) {
    fill_normal(x, rng, 0.0, 3.0);
  } else {
    fill_uniform_int(x, rng, t == DType::u8 ? 0 : -100, 100);
  }
  return x;
}

void expect_same_bits(const Tensor& expected, const Tensor& actual) {
  ASSERT_EQ(expected.dtype(), actual.dtype());
  ASSERT_EQ(expected.shape(), actual.shape());
  int64_t differ = 0;
  expected.for_each_index(
      [&](const Index& idx, int64_t) { differ += expected.get_bits(idx) != actual.get_bits(idx); });
  EXPECT_EQ(differ, 0) << dtype_name(expected.dtype());
}

TEST_F(Hdf5IoTest, RoundTripsEveryDtypeBitExactWithDtypeAttribute) {
  std::vector<Tensor> written;
  {
    H5File f = H5File::create(file("all.h5"));
    for (DType t : kAllDTypes) {
      // Large enough to be chunked + compressed, with an odd shape so chunks are ragged.
      Tensor x = random_tensor(t, {37, 129}, std::string(dtype_name(t)));
      f.write_tensor("tensors/" + std::string(dtype_name(t)), x);
      written.push_back(x);
    }
    f.commit();
  }
  H5File f = H5File::open(file("all.h5"));
  size_t i = 0;
  for (DType t : kAllDTypes) {
    const std::string name = "/tensors/" + std::string(dtype_name(t));
    EXPECT_EQ(f.attr_string(name, "dtype"), dtype_name(t));
    EXPECT_EQ(f.has_attr(name, "encoding"), is_fp8(t) || t == DType::bf16 || t == DType::f16);
    EXPECT_EQ(f.dataset_dtype(name), t);
    expect_same_bits(written[i++], f.read_tensor(name));
  }
  EXPECT_EQ(f.children("tensors").size(), std::size(kAllDTypes));
}

TEST_F(Hdf5IoTest, WritesTheLogicalContentsOfStridedViews) {
  const Tensor base = random_tensor(DType::bf16, {6, 10, 8}, "base");
  // Interleaved: every other row of a permuted, sliced view (negative-free but non-contiguous).
  const Tensor view = base.permute({1, 0, 2}).slice(0, 1, 10, 3).slice(2, 0, 8, 2);
  ASSERT_FALSE(view.is_contiguous());
  const Tensor fp8 = random_tensor(DType::e4m3fnuz, {16, 9}, "fp8").slice(1, 1, 9, 2);
  const Tensor scalar = base.select(0, 2).select(0, 3).select(0, 4);  // 0-d view
  const Tensor empty = Tensor::empty(DType::f32, {0, 5});
  {
    H5File f = H5File::create(file("views.h5"));
    f.write_tensor("view", view);
    f.write_tensor("fp8", fp8);
    f.write_tensor("scalar", scalar);
    f.write_tensor("empty", empty);
    f.commit();
  }
  H5File f = H5File::open(file("views.h5"));
  expect_same_bits(view.contiguous(), f.read_tensor("view"));
  expect_same_bits(fp8.contiguous(), f.read_tensor("fp8"));
  const Tensor s = f.read_tensor("scalar");
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.get_bits({}), scalar.get_bits({}));
  EXPECT_EQ(f.read_tensor("empty").shape(), (Shape{0, 5}));
  EXPECT_EQ(f.dataset_shape("view"), (Shape{3, 6, 4}));
}

TEST_F(Hdf5IoTest, SameContentGivesTheSameBytes) {
  // Goldens are hashed in a manifest: no timestamps may leak into the file.
  auto write = [&](const std::string& name) {
    H5File f = H5File::create(file(name));
    f.create_group("meta");
    f.set_attr("meta", "op", "mla_decode");
    f.write_tensor("a/b/out", random_tensor(DType::f32, {64, 64}, "det"));
    f.commit();
    std::ifstream in(file(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string first = write("one.h5");
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, write("two.h5"));
}

TEST_F(Hdf5IoTest, AttributesOfEveryKindOnGroupsDatasetsAndRoot) {
  {
    H5File f = H5File::create(file("attrs.h5"));
    f.create_group("/case/inputs");
    f.write_tensor("/case/inputs/q", Tensor::full(DType::f32, {2}, 1.5));
    f.set_attr("/", "version", int64_t{3});
    f.set_attr("case", "id", std::string("mla_decode/h8-bs16"));
    f.set_attr("case", "count", 42);          // int: stored as int64
    f.set_attr("case", "count", size_t{43});  // replacing is allowed
    f.set_attr("case/inputs/q", "scale", 0.125);
    f.set_attr_json("case", "params", nlohmann::json{{"heads", 8}, {"dtype", "bf16"}});
    f.commit();
  }
  H5File f = H5File::open(file("attrs.h5"));
  EXPECT_EQ(f.attr_int("/", "version"), 3);
  EXPECT_EQ(f.attr_string("/case", "id"), "mla_decode/h8-bs16");
  EXPECT_EQ(f.attr_int("case", "count"), 43);
  EXPECT_EQ(f.attr_double("case", "count"), 43.0);  // integers read as double too
  EXPECT_EQ(f.attr_double("case/inputs/q", "scale"), 0.125);
  EXPECT_EQ(f.attr_json("case", "params")["heads"], 8);
  EXPECT_TRUE(f.has_attr("case", "id"));
  EXPECT_FALSE(f.has_attr("case", "nope"));
  EXPECT_FALSE(f.has_attr("no/such", "id"));
  EXPECT_EQ(f.attr_names("case"), (std::vector<std::string>{"count", "id", "params"}));
  EXPECT_TRUE(f.has("case/inputs/q"));
  EXPECT_TRUE(f.is_dataset("case/inputs/q"));
  EXPECT_FALSE(f.is_dataset("case/inputs"));
  EXPECT_FALSE(f.has("case/inputs/q/deeper"));  // below a dataset
  EXPECT_FALSE(f.has("case/outputs"));
  EXPECT_EQ(f.children("/"), (std::vector<std::string>{"case"}));
  EXPECT_EQ(f.children("case/inputs"), (std::vector<std::string>{"q"}));
}

TEST_F(Hdf5IoTest, AttributeErrorsNameFileObjectAndAttribute) {
  {
    H5File f = H5File::create(file("a.h5"));
    f.create_group("g");
    f.set_attr("g", "s", "text");
    f.set_attr("g", "i", 7);
    f.commit();
  }
  H5File f = H5File::open(file("a.h5"));
  const std::string missing = error_of([&] { f.attr_string("g", "absent"); });
  EXPECT_TRUE(Contains(missing, file("a.h5").string()));
  EXPECT_TRUE(Contains(missing, "'/g'"));
  EXPECT_TRUE(Contains(missing, "no attribute 'absent'"));
  EXPECT_TRUE(Contains(error_of([&] { f.attr_int("g", "s"); }), "'s' is string, not an integer"));
  EXPECT_TRUE(Contains(error_of([&] { f.attr_string("g", "i"); }), "'i' is int64, not a string"));
  EXPECT_TRUE(Contains(error_of([&] { f.attr_json("g", "s"); }), "'s' is not JSON"));
  EXPECT_TRUE(Contains(error_of([&] { f.attr_int("nowhere", "i"); }), "no such object"));
  EXPECT_TRUE(Contains(error_of([&] { f.set_attr("g", "x", 1.0); }), "opened read-only"));
  EXPECT_TRUE(Contains(error_of([&] { f.children("nope"); }), "no such group"));
}

TEST_F(Hdf5IoTest, NothingAtTheFinalPathUntilCommit) {
  const fs::path p = file("sub/dir/golden.h5");  // parent directories are created
  H5File f = H5File::create(p);
  f.write_tensor("x", random_tensor(DType::bf16, {100, 100}, "x"));
  EXPECT_FALSE(fs::exists(p));
  // The data goes to one temporary name in the same directory, unpredictable (not the pid).
  const auto temporaries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(p.parent_path())) {
      const std::string n = e.path().filename().string();
      if (n.rfind("golden.h5.tmp.", 0) == 0) names.push_back(n);
    }
    return names;
  };
  const auto staged = temporaries();
  ASSERT_EQ(staged.size(), 1u);
  EXPECT_EQ(staged[0].size(), std::string("golden.h5.tmp.").size() + 16) << staged[0];
  EXPECT_NE(staged[0], "golden.h5.tmp." + std::to_string(::getpid()));
  f.commit();
  EXPECT_TRUE(fs::exists(p));
  EXPECT_TRUE(temporaries().empty());
  EXPECT_TRUE(Contains(error_of([&] { f.write_tensor("y", Tensor::zeros(DType::f32, {1})); }),
                       "closed (or committed)"));
  EXPECT_EQ(H5File::open(p).read_tensor("x").numel(), 10000);
}

TEST_F(Hdf5IoTest, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  const fs::path p = file("golden.h5");
  {
    H5File f = H5File::create(p);
    f.write_tensor("x", Tensor::full(DType::f32, {4}, 1.0));
    f.commit();
  }
  // A writer that fails midway (here: a duplicate dataset) and unwinds never commits.
  const std::string msg = error_of([&] {
    H5File f = H5File::create(p);
    f.write_tensor("x", Tensor::full(DType::f32, {4}, 2.0));
    f.write_tensor("x", Tensor::full(DType::f32, {4}, 3.0));
    f.commit();
  });
  EXPECT_TRUE(Contains(msg, "'/x': already exists"));
  EXPECT_EQ(entries(), 1u);                                   // no temporary file left behind
  EXPECT_EQ(H5File::open(p).read_tensor("x").get({0}), 1.0);  // the old file is intact

  { H5File abandoned = H5File::create(file("never.h5")); }
  EXPECT_FALSE(fs::exists(file("never.h5")));
  EXPECT_EQ(entries(), 1u);
}

TEST_F(Hdf5IoTest, MissingFileIsAnErrorNamingIt) {
  const std::string msg = error_of([&] { H5File::open(file("absent.h5")); });
  EXPECT_TRUE(Contains(msg, file("absent.h5").string()));
  EXPECT_TRUE(Contains(msg, "no such file"));
}

TEST_F(Hdf5IoTest, GarbageFileIsAnErrorNamingIt) {
  {
    std::ofstream out(file("garbage.h5"), std::ios::binary);
    for (int i = 0; i < 5000; ++i) out.put(static_cast<char>((i * 7919) & 0xFF));
  }
  const std::string msg = error_of([&] { H5File::open(file("garbage.h5")); });
  EXPECT_TRUE(Contains(msg, file("garbage.h5").string()));
  EXPECT_TRUE(Contains(msg, "not an HDF5 file"));
  std::ofstream(file("empty.h5")).close();
  EXPECT_TRUE(Contains(error_of([&] { H5File::open(file("empty.h5")); }), "not an HDF5 file"));
}

TEST_F(Hdf5IoTest, TruncatedFileIsAnErrorNamingIt) {
  const fs::path p = file("trunc.h5");
  {
    H5File f = H5File::create(p);
    f.write_tensor("big", random_tensor(DType::f32, {256, 256}, "big"));
    f.commit();
  }
  const auto size = fs::file_size(p);
  // Cut at several points: inside the data, inside the metadata, inside the superblock.
  for (const auto cut : {size - 1, size / 2, uintmax_t{4096}, uintmax_t{100}, uintmax_t{8}}) {
    SCOPED_TRACE(cut);
    fs::copy_file(p, file("cut.h5"), fs::copy_options::overwrite_existing);
    fs::resize_file(file("cut.h5"), cut);
    const std::string msg = error_of([&] {
      H5File f = H5File::open(file("cut.h5"));
      f.read_tensor("big");
    });
    EXPECT_TRUE(Contains(msg, file("cut.h5").string()));
    // HDF5 compares the end-of-file address in the superblock with the real size at open.
    if (cut >= 100)
      EXPECT_TRUE(Contains(msg, "truncated file: eof = " + std::to_string(cut)));
    else
      EXPECT_TRUE(Contains(msg, "cannot open"));
  }
}

TEST_F(Hdf5IoTest, CorruptDataIsAnErrorNamingTheDataset) {
  const fs::path p = file("corrupt.h5");
  {
    H5File f = H5File::create(p);
    f.write_tensor("big", random_tensor(DType::f32, {256, 256}, "big"));
    f.commit();
  }
  // Overwrite the middle of the compressed chunks: the file opens, inflating fails.
  {
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(p) / 2));
    for (int i = 0; i < 2048; ++i) io.put(static_cast<char>(i * 31));
  }
  H5File f = H5File::open(p);
  const std::string msg = error_of([&] { f.read_tensor("big"); });
  EXPECT_TRUE(Contains(msg, p.string()));
  EXPECT_TRUE(Contains(msg, "'/big'"));
  EXPECT_TRUE(Contains(msg, "cannot read the data"));
}

TEST_F(Hdf5IoTest, MissingDatasetAndWrongDtypeOrShapeAreErrors) {
  {
    H5File f = H5File::create(file("d.h5"));
    f.write_tensor("out/o", Tensor::zeros(DType::bf16, {4, 16}));
    f.commit();
  }
  H5File f = H5File::open(file("d.h5"));
  const std::string missing = error_of([&] { f.read_tensor("out/lse"); });
  EXPECT_TRUE(Contains(missing, file("d.h5").string()));
  EXPECT_TRUE(Contains(missing, "'/out/lse': no such dataset"));
  EXPECT_TRUE(Contains(error_of([&] { f.read_tensor("out"); }), "'/out': is not a dataset"));

  const std::string wrong_dtype = error_of([&] {
    f.read_tensor("out/o", DType::e4m3fn, Shape{4, 16});
  });
  EXPECT_TRUE(Contains(wrong_dtype, file("d.h5").string()));
  EXPECT_TRUE(Contains(wrong_dtype, "'/out/o': expected fp8_e4m3fn[4,16], found bf16[4,16]"));
  EXPECT_TRUE(Contains(error_of([&] {
                         f.read_tensor("/out/o", DType::bf16, Shape{4, 8});
                       }),
                       "expected bf16[4,8], found bf16[4,16]"));
  EXPECT_EQ(f.read_tensor("out/o", DType::bf16, Shape{4, 16}).numel(), 64);
}

TEST_F(Hdf5IoTest, DtypeAttributeMustMatchTheStoredType) {
  {
    H5File f = H5File::create(file("m.h5"));
    f.write_tensor("a", Tensor::zeros(DType::f32, {3}));
    f.set_attr("a", "dtype", "bf16");  // a lie: float32 storage
    f.write_tensor("b", Tensor::zeros(DType::u8, {3}));
    f.set_attr("b", "dtype", "fp9_e4m4");
    f.write_tensor("c", Tensor::zeros(DType::f16, {3}));
    f.commit();
  }
  H5File f = H5File::open(file("m.h5"));
  EXPECT_TRUE(Contains(error_of([&] { f.read_tensor("a"); }),
                       "stored as float32, but dtype attribute 'bf16' needs uint16"));
  EXPECT_TRUE(
      Contains(error_of([&] { f.read_tensor("b"); }), "unknown dtype attribute 'fp9_e4m4'"));
  EXPECT_EQ(f.read_tensor("c").dtype(), DType::f16);
}

TEST_F(Hdf5IoTest, WriteErrorsNameTheObject) {
  H5File f = H5File::create(file("w.h5"));
  f.write_tensor("t", Tensor::zeros(DType::i32, {2}));
  EXPECT_TRUE(Contains(error_of([&] { f.write_tensor("t/u", Tensor::zeros(DType::i32, {2})); }),
                       "'/t': exists and is not a group"));
  EXPECT_TRUE(Contains(error_of([&] { f.write_tensor("u", Tensor()); }), "undefined tensor"));
  EXPECT_TRUE(Contains(error_of([&] { f.set_attr("nothing", "a", 1); }), "no such object"));
}

TEST_F(Hdf5IoTest, MovedFileKeepsItsState) {
  H5File a = H5File::create(file("moved.h5"));
  a.write_tensor("x", Tensor::full(DType::i64, {2}, 5));
  H5File b = std::move(a);
  b.commit();
  EXPECT_EQ(H5File::open(file("moved.h5")).read_tensor("x").get({1}), 5.0);
}

}  // namespace
}  // namespace attncheck
