// The atomic file writer moved to core (core/atomic_file.h) so that the data module's
// shard packer can use it without depending on train; this name stays for train's users.
#pragma once

#include "core/atomic_file.h"
