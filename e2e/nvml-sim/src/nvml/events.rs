//! NVML's event sets (`nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`,
//! `nvmlEventSetFree`) over the events in the state ([`crate::state::SimEvent`]), which
//! `sim-ctl event` (or [`crate::ctl::event`]) adds the way the driver would on an XID or an ECC
//! error. As in nvml.h: a set delivers only events after its creation, of the types and GPUs
//! registered in it; a MIG device cannot register (NOT_SUPPORTED: events come on the parent GPU,
//! with the GPU and compute instance IDs of the error); a wait with nothing to deliver ends in
//! TIMEOUT after `timeoutms`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The event types the simulated GPUs support: what NVIDIA's device plugin and DRA driver watch.
pub const SUPPORTED_EVENTS: u64 =
    (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError) as u64;

const ERR_TIMEOUT: u32 = 10;

/// What one event set holds: the registered GPUs with their event masks, and the sequence number
/// of the last event it delivered (or of the last event before its creation).
struct SimEventSet {
    inner: Mutex<(Vec<(u32, u64)>, u64)>,
}

fn event_set<'a>(set: nvmlEventSet_t) -> Result<&'a SimEventSet, u32> {
    if set.is_null() {
        return Err(ERR_INVALID_ARGUMENT);
    }
    Ok(unsafe { &*(set as *const SimEventSet) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    read("nvmlEventSetCreate", |st| {
        if set.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let last = st.events.last().map_or(0, |e| e.seq);
        let boxed = Box::new(SimEventSet {
            inner: Mutex::new((Vec::new(), last)),
        });
        unsafe { out(set, Box::into_raw(boxed) as nvmlEventSet_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    if set.is_null() {
        return ERR_INVALID_ARGUMENT;
    }
    drop(unsafe { Box::from_raw(set as *mut SimEventSet) });
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(dev: nvmlDevice_t, types: *mut u64) -> nvmlReturn_t {
    read_on("nvmlDeviceGetSupportedEventTypes", gpu_of(dev), |st| {
        let (kind, gpu, _, _) = unpack(dev);
        if kind != K_DEVICE && kind != K_MIG {
            return Err(ERR_INVALID_ARGUMENT);
        }
        st.gpus.get(gpu as usize).ok_or(ERR_INVALID_ARGUMENT)?;
        unsafe { out(types, SUPPORTED_EVENTS) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(dev: nvmlDevice_t, types: u64, set: nvmlEventSet_t) -> nvmlReturn_t {
    read_on("nvmlDeviceRegisterEvents", gpu_of(dev), |st| {
        let (kind, gpu, _, _) = unpack(dev);
        let s = event_set(set)?;
        match kind {
            K_DEVICE => {}
            K_MIG => return Err(ERR_NOT_SUPPORTED),
            _ => return Err(ERR_INVALID_ARGUMENT),
        }
        st.gpus.get(gpu as usize).ok_or(ERR_INVALID_ARGUMENT)?;
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(ERR_NOT_SUPPORTED);
        }
        let mut inner = s.inner.lock().map_err(|_| ERR_UNKNOWN)?;
        inner.0.retain(|(g, _)| *g != gpu);
        inner.0.push((gpu, types));
        Ok(())
    })
}

/// Waits until an event of a registered type and GPU comes, or `timeout_ms` passes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let Ok(s) = event_set(set) else {
        return ERR_INVALID_ARGUMENT;
    };
    if data.is_null() {
        return ERR_INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    loop {
        let mut found = None;
        let code = read("nvmlEventSetWait_v2", |st| {
            let mut inner = s.inner.lock().map_err(|_| ERR_UNKNOWN)?;
            let after = inner.1;
            found = st
                .events
                .iter()
                .filter(|e| e.seq > after)
                .find(|e| inner.0.iter().any(|(g, mask)| *g == e.gpu && mask & e.event_type != 0))
                .cloned();
            // Events of other GPUs or types are passed over for good, as by the driver's queue.
            inner.1 = match &found {
                Some(e) => e.seq,
                None => st.events.last().map_or(after, |e| e.seq.max(after)),
            };
            Ok(())
        });
        if code != SUCCESS {
            return code;
        }
        if let Some(e) = found {
            let event = nvmlEventData_t {
                device: pack(K_DEVICE, e.gpu, 0, 0) as nvmlDevice_t,
                eventType: e.event_type,
                eventData: e.data,
                gpuInstanceId: e.gpu_instance.unwrap_or(NO_VALUE),
                computeInstanceId: e.compute_instance.unwrap_or(NO_VALUE),
            };
            unsafe { *data = event };
            return SUCCESS;
        }
        let now = Instant::now();
        if now >= deadline {
            return ERR_TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
    }
}
