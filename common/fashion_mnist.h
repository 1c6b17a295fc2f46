// Fashion-MNIST: 60,000 training and 10,000 test images of 28x28 grey pixels, 10 classes.
// The four gzip'd IDX files are read with zlib; pixels are scaled to [0, 1] as d2l does.
//
// The directory: --data-dir if given, else $FASHION_MNIST_DIR if set (either is used as named,
// or refused, never passed over for another place); else the first of data/fashion-mnist/ (in
// the repository) and /usr/share/datasets/fashion-mnist/ (Debian's dataset-fashion-mnist) that
// holds the files.
// A missing, truncated or corrupt file raises mgpu::Error naming the file and the fault
// (data/README.md lists every check).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mgpu {

struct LabeledImages {
  int count = 0, rows = 0, cols = 0;
  std::vector<float> pixels;         // [count][rows * cols], in [0, 1]
  std::vector<std::int32_t> labels;  // [count], each in 0..9
  int pixels_per_image() const { return rows * cols; }
};

struct FashionMnist {
  std::string dir;  // where the files were found
  LabeledImages train, test;
};

inline constexpr int kClasses = 10;
inline const char* const kClassNames[kClasses] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                                  "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};

// The directory to read from; throws mgpu::Error naming a chosen folder that is not one, or
// listing every place it looked.
std::string find_fashion_mnist(const std::string& data_dir_flag);

// One IDX pair (images + labels), any image size. Each file must be a regular file holding
// exactly one whole gzip member whose CRC-32 and length zlib has verified, with nothing after
// it. Checks the magic numbers; that the image header declares at least one image, no side
// of 0 and at most 1 GiB of pixels; that each file holds exactly what its header declares;
// that both hold the same number of examples; and that labels are 0..9. Memory grows with the
// data actually read, never sized from a header's count alone. With `rows` and `cols` given
// (not 0), the header must declare images of that shape, checked before any pixel is read.
LabeledImages load_idx(const std::string& images_path, const std::string& labels_path, int rows = 0, int cols = 0);

// Both splits, whose images must be 28x28. limit_train > 0 keeps the first limit_train
// training images; 0, or a limit at or above the training set's size, keeps them all; a
// negative limit is refused.
FashionMnist load_fashion_mnist(const std::string& data_dir_flag, int limit_train = 0);

}  // namespace mgpu
