//! Device handles by PCI bus ID and by UUID, the way NVIDIA's tools find a GPU (go-nvlib's
//! `NewDeviceByUUID`, the device plugin, DCGM) rather than by index.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;
use crate::state::PciAddress;

/// One hexadecimal field as C's `%x` reads it (an optional `0x`), at most 32 bits.
fn hex(s: &str) -> Option<u32> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// A bus ID in one of the forms nvml.h documents for `nvmlDeviceGetHandleByPciBusId_v2`, "all
/// numbers in hexadecimal": `domain:bus:device.function` (`%x:%x:%x.%x`, e.g. `0000:18:00.0` or
/// `00000000:18:00.0`), `domain:bus:device` (`%x:%x:%x`) and `bus:device.function` (`%x:%x.%x`,
/// domain 0). Without a function, function 0 (a GPU's). Anything else is not a bus ID.
pub fn parse_bus_id(s: &str) -> Option<PciAddress> {
    let (head, function) = match s.rsplit_once('.') {
        Some((h, f)) => (h, Some(hex(f)?)),
        None => (s, None),
    };
    let parts: Vec<&str> = head.split(':').collect();
    match (parts.as_slice(), function) {
        ([d, b, dev], f) => Some((hex(d)?, hex(b)?, hex(dev)?, f.unwrap_or(0))),
        ([b, dev], Some(f)) => Some((0, hex(b)?, hex(dev)?, f)),
        _ => None,
    }
}

unsafe fn c_str<'a>(p: *const c_char) -> Result<&'a str, u32> {
    if p.is_null() {
        return Err(ERR_INVALID_ARGUMENT);
    }
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| ERR_INVALID_ARGUMENT)
}

/// nvml.h: INVALID_ARGUMENT "if pciBusId is invalid or device is NULL", NOT_FOUND "if pciBusId
/// does not match a valid device on the system".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetHandleByPciBusId_v2", |st| {
        let wanted = parse_bus_id(unsafe { c_str(bus_id)? }.trim()).ok_or(ERR_INVALID_ARGUMENT)?;
        if dev.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = st
            .gpus
            .iter()
            .find(|g| g.pci_address() == wanted)
            .ok_or(ERR_NOT_FOUND)?;
        unsafe { out(dev, pack(K_DEVICE, g.index, 0, 0) as nvmlDevice_t) }
    })
}

/// The call's first version: the same lookup (nvml.h: it differed only in answering NOT_FOUND
/// where v2 answers NO_PERMISSION, which the simulator never does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, dev: *mut nvmlDevice_t) -> nvmlReturn_t {
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, dev) }
}

/// nvml.h: "The UUID of the target GPU or MIG instance"; a MIG UUID gives a MIG device handle.
/// INVALID_ARGUMENT "if uuid is invalid or device is null", NOT_FOUND "if uuid does not match a
/// valid device on the system".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut nvmlDevice_t) -> nvmlReturn_t {
    read("nvmlDeviceGetHandleByUUID", |st| {
        let uuid = unsafe { c_str(uuid)? };
        if uuid.is_empty() || dev.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let handle = st.gpus.iter().find_map(|g| {
            if g.uuid == uuid {
                return Some(pack(K_DEVICE, g.index, 0, 0));
            }
            g.gis.iter().find_map(|gi| {
                gi.cis
                    .iter()
                    .find(|c| c.uuid == uuid)
                    .map(|c| pack(K_MIG, g.index, gi.id, c.id))
            })
        });
        unsafe { out(dev, handle.ok_or(ERR_NOT_FOUND)? as nvmlDevice_t) }
    })
}

#[cfg(test)]
mod tests {
    use super::parse_bus_id;

    #[test]
    fn bus_ids_parse_in_the_forms_nvml_h_documents() {
        for s in [
            "00000000:18:00.0",
            "0000:18:00.0",
            "0:18:0.0",
            "0000:18:00",
            "18:00.0",
            "0x0:0x18:0x0.0x0",
        ] {
            assert_eq!(parse_bus_id(s), Some((0, 0x18, 0, 0)), "{s}");
        }
        assert_eq!(parse_bus_id("0001:AB:1f.3"), Some((1, 0xAB, 0x1F, 3)));
        assert_eq!(parse_bus_id("ab:1F.3"), Some((0, 0xAB, 0x1F, 3)));
        for s in [
            "",
            "18",
            "18:00",
            "zz:00.0",
            "0000:18:00.0.0",
            "0000:18:00:00.0",
            "123456789:18:00.0",
            "18:00.",
        ] {
            assert_eq!(parse_bus_id(s), None, "{s:?}");
        }
    }
}
