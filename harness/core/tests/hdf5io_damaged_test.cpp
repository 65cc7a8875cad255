// HDF5 files that lie: extents checked against what the file stores before anything is
// allocated, and reads of damaged files in a child process (read_in_child).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/hdf5io.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

// Regression: a dataset declared [2^38] and never written made read_tensor allocate its declared
// size (1 TiB: std::bad_alloc; 4 GiB in the report) before any check.
TEST(Hdf5Damaged, DeclaredHugeDatasetIsRefusedBeforeAllocating) {
  const fs::path path =
      fs::temp_directory_path() / ("attncheck_huge_" + std::to_string(::getpid()) + ".h5");
  {
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hsize_t dims[1] = {hsize_t{1} << 38};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d =
        H5Dcreate2(f, "big", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(f);
  }
  const H5File f = H5File::open(path);
  EXPECT_EQ(f.dataset_shape("big"), (Shape{int64_t{1} << 38}));
  try {
    (void)f.read_tensor("big");
    ADD_FAILURE() << "read a dataset the file does not store";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "declares [274877906944] (1099511627776 bytes) but stores 0 bytes"),
              std::string::npos)
        << e.what();
  }
  fs::remove(path);
}

TEST(Hdf5Damaged, ReadInChildReportsCrashesHangsAndErrors) {
  EXPECT_EQ(read_in_child([] {}, 10), "");
  EXPECT_EQ(read_in_child([] { throw std::runtime_error("bad file"); }, 10), "bad file");
  const std::string crash = read_in_child([] { std::raise(SIGSEGV); }, 10);
  EXPECT_NE(crash.find("crashed with signal 11"), std::string::npos) << crash;
  const std::string hang =
      read_in_child([] { std::this_thread::sleep_for(std::chrono::seconds(30)); }, 0.5);
  EXPECT_NE(hang.find("timed out after 0.5 s"), std::string::npos) << hang;
}

// Regression: GoldenStore::load holds hdf5_mutex() while it probes a golden file in a child; the
// child's read locked it again and waited for the parent's thread (its recorded owner) until the
// timeout, and the file was reported unreadable.
TEST(Hdf5Damaged, ReadInChildMayLockTheHdf5LockItsCallerHolds) {
  const std::lock_guard<std::recursive_mutex> held(hdf5_mutex());
  EXPECT_EQ(
      read_in_child([] { const std::lock_guard<std::recursive_mutex> again(hdf5_mutex()); }, 10),
      "");
}

}  // namespace
}  // namespace attncheck
