// What device_common.cpp gives the two backends' files, device_cuda.cpp and device_cpu.cpp: how
// a device is named in messages, the ids that tell devices apart, and the table of which device
// owns which memory. Only those three files include it; everyone else uses device.h.
#pragma once
#include <cstddef>
#include <string>

#include "device.h"

namespace mgpu {

// "device 1 (cuda:0)": how the checks name a device.
std::string describe(const Device& d);

// The checks both backends' constructors make, so that both refuse in the same words:
// a DeviceSet of fewer than one device, and an Event for a device no DeviceSet made.
void check_device_count(int k);
void check_event_owner(const Device& owner);

// Every DeviceSet's devices get new ids, so devices of two sets never pass for each other.
int next_device_id();

// The ownership table that check_owned() reads: device_allocate() enters each allocation,
// device_free() takes it out (and remembers it a while, so that a use after the free is named).
void remember_allocation(const Device& d, void* p, std::size_t bytes);
void forget_allocation(void* p) noexcept;

}  // namespace mgpu
