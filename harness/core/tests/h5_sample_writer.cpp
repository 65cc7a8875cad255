// Writes a small HDF5 file that test_h5_numpy.py decodes with h5py + numpy alone: the proof that
// goldens and repro bundles are readable without our C++ (docs/formats.md, storage rules).
// Usage: h5_sample_writer OUT.h5
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <vector>

#include "core/hdf5io.h"
#include "core/numeric.h"

using namespace attncheck;

namespace {

Tensor from_values(DType t, const std::vector<double>& values) {
  Tensor x = Tensor::empty(t, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) x.set({static_cast<int64_t>(i)}, values[i]);
  return x;
}

// All 256 codes of an fp8 format and our decoding of each (NaN where the format says NaN).
void write_fp8_table(H5File& f, DType t) {
  const std::string g = "/" + std::string(dtype_name(t));
  Tensor codes = Tensor::empty(t, {256});
  Tensor decoded = Tensor::empty(DType::f64, {256});
  for (int64_t c = 0; c < 256; ++c) {
    codes.set_bits({c}, static_cast<uint64_t>(c));
    decoded.set({c}, fp8_decode(static_cast<uint8_t>(c), t));
  }
  f.write_tensor(g + "/all_codes", codes);
  f.write_tensor(g + "/all_decoded", decoded);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.h5\n", argv[0]);
    return 2;
  }
  try {
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    H5File f = H5File::create(argv[1]);
    f.set_attr("/", "producer", "h5_sample_writer");
    f.set_attr("/", "version", 1);
    f.set_attr("/", "scale", 0.5);
    // Values chosen to exercise sign, subnormals, rounding, max, inf/NaN of each format; the
    // Python side knows them independently and decodes the stored bits itself.
    f.write_tensor("/bf16/values",
                   from_values(DType::bf16, {1.0, -2.5, 3.14159265, 65280.0, std::ldexp(1.0, -130),
                                             -0.0, 3.3895313892515355e38, inf, -inf, nan}));
    f.write_tensor("/fp8_e4m3fn/values",
                   from_values(DType::e4m3fn,
                               {448.0, -448.0, 1000.0, std::ldexp(1.0, -9), 1.0, -0.0, 0.3, nan}));
    f.write_tensor("/fp8_e4m3fnuz/values",
                   from_values(DType::e4m3fnuz,
                               {240.0, -240.0, 1000.0, std::ldexp(1.0, -10), 1.0, -0.0, 0.3, nan}));
    f.write_tensor("/f32/values", from_values(DType::f32, {1.5, -2.25, 1e-45, 3.0e38, -inf}));
    f.write_tensor("/i32/values",
                   from_values(DType::i32, {-7, 0, 2147483647.0, -2147483648.0, 123456}));
    // A 2-D strided view: the file holds its logical contents.
    Tensor grid = Tensor::empty(DType::bf16, {4, 6});
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; ++j) grid.set({i, j}, static_cast<double>(10 * i + j));
    f.write_tensor("/bf16/transposed", grid.permute({1, 0}));
    for (DType t : {DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz})
      write_fp8_table(f, t);
    f.commit();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h5_sample_writer: %s\n", e.what());
    return 1;
  }
  return 0;
}
