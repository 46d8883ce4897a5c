// Data-parallel wiring of a training run: which communicator carries the gradients and
// which buffer its buckets reduce.
//   host backend:   the host (MPI) communicator over the model's host gradients (grad_data());
//   device backend: a device communicator (NCCL) on this rank's device, ordered after the
//                   backend's compute stream (Backend::native_stream()), over the model's
//                   device gradients (compute_grad_data()).
// The device copies exist once the model is placed on the backend's memory, which this does
// (Model::place_on copies the host buffers there). So the initial broadcasts of weights,
// BN statistics and momentum, made on the host buffers, must come first.
#pragma once

#include <functional>
#include <memory>

#include "dist/communicator.h"
#include "dist/grad_buckets.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/batch_norm.h"
#include "train/config.h"

namespace rn {

// make_nccl_communicator's signature (dist/nccl_communicator.h); tests substitute their own.
using DeviceCommunicatorFactory = std::function<std::unique_ptr<Communicator>(Communicator& host, int device,
                                                                              void* compute_stream, double timeout_s)>;

struct GradientSync {
  std::unique_ptr<Communicator> device_comm;  // made here when the gradients live on a device
  Communicator* comm = nullptr;               // carries the gradients: device_comm, or the host one
  std::unique_ptr<GradientReducer> reducer;   // null in a world of one
  bool on_device() const { return device_comm != nullptr; }
};

// `device`: this rank's accelerator (World::device, the one the backend was made for).
// A world of one (host.size() == 1) gets an empty GradientSync.
GradientSync make_gradient_sync(Model& model, Backend& backend, Communicator& host, int device, const DistConfig& dist,
                                const DeviceCommunicatorFactory& make_device_comm);

// Synchronised batch norm's reducer of per-channel sums (dist.sync_bn): over the device
// communicator when the gradients live on a device (NCCL on device memory: the compute
// stream waits for each sum, the host does not), else over the host one.
std::unique_ptr<BatchStatsReducer> make_bn_stats_reducer(const GradientSync& sync, Communicator& host);

}  // namespace rn
