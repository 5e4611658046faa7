//! The GPUs' error events through NVML's event sets, as NVIDIA's device plugin watches them:
//! every GPU registered for XID and double-bit ECC events (where it supports them; a GPU that
//! cannot register is reported unmonitored), then waits of a second until stopped. Raw calls,
//! because the wrapper's event data leaves out the GPU and compute instance of an error.

// NVML's C constants, matched by their own names.
#![allow(non_upper_case_globals)]

use super::NvmlGpus;
use super::ffi::{NvmlError, err, sym};
use crate::gpu::health::{DriverError, HealthSignal};
use nvml_wrapper::error::nvml_try;
use nvml_wrapper_sys::bindings::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long one wait lasts: how soon a stop is seen.
const WAIT_MS: u32 = 1000;
/// NVML's "no instance" in an event.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;
const WATCHED: u64 = (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError) as u64;

impl NvmlGpus {
    pub(super) fn watch_events(&self, stop: &AtomicBool, report: &mut dyn FnMut(HealthSignal)) {
        let set = match self.event_set(report) {
            Ok(s) => s,
            Err(e) => {
                // Nothing can be watched: every GPU is reported unmonitored until a later try works.
                let e = e.to_string();
                while !stop.load(Ordering::Relaxed) {
                    report(HealthSignal::WaitFailed(e.clone()));
                    std::thread::sleep(Duration::from_millis(WAIT_MS.into()));
                }
                return;
            }
        };
        let (set, uuids) = set;
        let Ok(wait) = sym(self.lib().nvmlEventSetWait_v2.as_ref()) else {
            report(HealthSignal::WaitFailed(
                "the NVML library lacks nvmlEventSetWait_v2".into(),
            ));
            return;
        };
        while !stop.load(Ordering::Relaxed) {
            let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
            let code = unsafe { wait(set, &mut data, WAIT_MS) };
            match code {
                nvmlReturn_enum_NVML_SUCCESS => {
                    report(HealthSignal::Waited);
                    if let Some(signal) = self.signal(&data, &uuids) {
                        report(signal);
                    }
                }
                nvmlReturn_enum_NVML_ERROR_TIMEOUT => report(HealthSignal::Waited),
                _ => {
                    let e = nvml_try(code)
                        .err()
                        .map_or_else(|| format!("code {code}"), |e| e.to_string());
                    report(HealthSignal::WaitFailed(format!("nvmlEventSetWait_v2: {e}")));
                    std::thread::sleep(Duration::from_millis(WAIT_MS.into()));
                }
            }
        }
        if let Ok(free) = sym(self.lib().nvmlEventSetFree.as_ref()) {
            unsafe { free(set) };
        }
    }

    /// An event set with every GPU registered that can be, and each GPU's UUID by its handle.
    fn event_set(
        &self,
        report: &mut dyn FnMut(HealthSignal),
    ) -> Result<(nvmlEventSet_t, HashMap<usize, String>), NvmlError> {
        let lib = self.lib();
        let create = sym(lib.nvmlEventSetCreate.as_ref())?;
        let supported = sym(lib.nvmlDeviceGetSupportedEventTypes.as_ref())?;
        let register = sym(lib.nvmlDeviceRegisterEvents.as_ref())?;
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        nvml_try(unsafe { create(&mut set) }).map_err(|e| err("nvmlEventSetCreate", e))?;
        let count = self.nvml.device_count().map_err(|e| err("nvmlDeviceGetCount_v2", e))?;
        let mut uuids = HashMap::new();
        for index in 0..count {
            let Ok(dev) = self.nvml.device_by_index(index) else {
                // Discovery reports it unreadable, and so unhealthy.
                continue;
            };
            let Ok(uuid) = dev.uuid() else { continue };
            let handle = unsafe { dev.handle() };
            let mut types = 0u64;
            let registered = nvml_try(unsafe { supported(handle, &mut types) })
                .map_err(|e| err("nvmlDeviceGetSupportedEventTypes", e))
                .and_then(|()| match types & WATCHED {
                    0 => Err(NvmlError::NoHealthEvents),
                    watched => nvml_try(unsafe { register(handle, watched, set) })
                        .map_err(|e| err("nvmlDeviceRegisterEvents", e)),
                });
            if let Err(error) = registered {
                report(HealthSignal::Unmonitored {
                    gpu: uuid.clone(),
                    error: error.to_string(),
                });
            }
            uuids.insert(handle as usize, uuid);
        }
        Ok((set, uuids))
    }

    fn signal(&self, data: &nvmlEventData_t, uuids: &HashMap<usize, String>) -> Option<HealthSignal> {
        let error = match data.eventType as u32 {
            nvmlEventTypeXidCriticalError => DriverError::Xid(data.eventData),
            nvmlEventTypeDoubleBitEccError => DriverError::EccUncorrectable,
            _ => return None,
        };
        let gpu = match uuids.get(&(data.device as usize)) {
            Some(u) => u.clone(),
            // A handle not seen at registration: the event set has no other GPUs, so ask NVML.
            None => {
                let f = sym(self.lib().nvmlDeviceGetUUID.as_ref()).ok()?;
                let mut buf = [0 as std::ffi::c_char; 96];
                nvml_try(unsafe { f(data.device, buf.as_mut_ptr(), buf.len() as u32) }).ok()?;
                unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
        Some(HealthSignal::Reported {
            gpu,
            error,
            gpu_instance: instance(data.gpuInstanceId),
            compute_instance: instance(data.computeInstanceId),
        })
    }
}
