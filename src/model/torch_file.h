// Reads the state dict out of a file written by PyTorch's torch.save (torchvision's
// "resnet50-0676ba61.pth", a training script's checkpoint), in C++, without Python and
// without running anything the file holds.
//
// Both of torch.save's containers are read:
//   zip     (the default since PyTorch 1.6) a stored zip archive: <name>/data.pkl, the pickled
//           object, whose tensors refer to storages <name>/data/<key> by key;
//   legacy  (_use_new_zipfile_serialization=False, and files from before 1.6) a magic number,
//           a protocol version and the system info, each pickled, then the object, the list
//           of storage keys, and each storage as an int64 element count and its bytes.
//
// The pickle is interpreted by a small machine that knows the opcodes torch.save emits
// (protocols 2 to 5) and builds plain values: it never imports or calls anything. It knows the
// few functions that rebuild tensors (torch._utils._rebuild_tensor_v2, _rebuild_parameter) and
// OrderedDict; every other global becomes an opaque object that only names itself in errors.
// A pickled nn.Module (torch.save(model) rather than its state_dict()) is refused by name.
//
// Every failure is an rn::Error naming the file and what is wrong; arbitrary bytes give an error,
// never a crash (fuzz/torch_file_fuzz.cpp), and no allocation exceeds what the file could hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rn {

struct TorchTensor {
  std::string dtype;            // the storage's element type as a safetensors tag: "F32", "F16", "BF16", "I64", ...
  size_t element_size = 0;      // bytes per element
  std::vector<int64_t> shape;   // the tensor's size
  std::vector<std::byte> data;  // dense row-major, little-endian: the tensor's strides and offset applied
};

struct TorchStateDict {
  std::string format;  // "zip" or "legacy"
  // Where the state dict was: "" (the file is the state dict) or the key of the dict that holds
  // it ("state_dict", "model", "model_state_dict", "model_state" or "module").
  std::string key;
  std::vector<std::pair<std::string, TorchTensor>> tensors;  // in the file's order
  std::vector<std::string> other_entries;                    // entries that are not tensors, by name
};

// Reads `path`; throws rn::Error naming it on any problem.
TorchStateDict read_torch_state_dict(const std::string& path);

// The same on bytes in memory; `what` names them in errors.
TorchStateDict parse_torch_state_dict(std::span<const std::byte> bytes, const std::string& what);

// True when `head` (4 bytes or more) starts like a torch.save file: a zip archive, or the legacy
// container's pickled magic number.
bool looks_like_torch_file(std::span<const std::byte> head);

}  // namespace rn
