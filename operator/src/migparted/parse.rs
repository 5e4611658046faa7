//! Reading a mig-parted file with the rules NVIDIA's mig-parted applies when it loads one, so that
//! `import` refuses what `nvidia-mig-parted apply` would refuse, and says where.
//!
//! The rules, from NVIDIA/mig-parted: `api/spec/v1/spec.go` (`Spec.UnmarshalJSON`,
//! `MigConfigSpec.UnmarshalJSON`), `pkg/types/mig_config.go` (`MigConfig.AssertValidFormat`) and the
//! MIG profile parser it calls in go-nvlib (`pkg/nvlib/device/mig_profile.go`, `parseMigProfile`).
//! A few refusals are ours, marked so: a plan's device list cannot say what mig-parted lets through.

use super::file::{
    DeviceFilter, Devices, EntryProblem, MigPartedEntry, MigPartedError, MigPartedFile, ProfileFormatError, VERSION,
};
use crate::devices::MAX_DEVICE_INDEX;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The most instances of one profile an entry may ask for: no GPU holds more than 7 GPU instances,
/// nor more than 8 compute instances in one; a larger count is a typo that would otherwise become
/// that many list items in the imported plan.
const MAX_PROFILE_COUNT: u64 = 8;

const ENTRY_FIELDS: [&str; 4] = ["device-filter", "devices", "mig-enabled", "mig-devices"];

pub(super) fn parse(yaml: &str) -> Result<MigPartedFile, MigPartedError> {
    let doc: Value = serde_saphyr::from_str(yaml).map_err(|e| MigPartedError::Yaml(first_line(&e.to_string())))?;
    let top = match doc {
        // An empty document is a file with no configs: mig-parted's own test "Empty" accepts it.
        Value::Null => return Ok(empty()),
        Value::Object(map) => map,
        other => return Err(MigPartedError::NotAMapping(show(&other))),
    };
    // spec.go: `version` is required and must be exactly v1, before anything else is looked at.
    match top.get("version") {
        None => return Err(MigPartedError::MissingVersion),
        Some(Value::String(v)) if v == VERSION => {}
        Some(other) => return Err(MigPartedError::Version(show(other))),
    }
    // spec.go: any other top-level field is "unexpected".
    if let Some(field) = top.keys().find(|k| *k != "version" && *k != "mig-configs") {
        return Err(MigPartedError::UnknownField(field.clone()));
    }
    let mut file = empty();
    let Some(configs) = top.get("mig-configs") else {
        // spec.go accepts `version: v1` alone (test "Only version field").
        return Ok(file);
    };
    let configs = match configs {
        // A null map decodes to an empty one in Go, then "at least one entry" refuses it.
        Value::Null => return Err(MigPartedError::NoConfigs),
        Value::Object(map) => map,
        other => return Err(MigPartedError::ConfigsNotAMapping(show(other))),
    };
    if configs.is_empty() {
        return Err(MigPartedError::NoConfigs);
    }
    for (config, entries) in configs {
        let entries = match entries {
            Value::Null => return Err(MigPartedError::EmptyConfig(config.clone())),
            Value::Array(list) => list,
            other => {
                return Err(MigPartedError::ConfigNotAList {
                    config: config.clone(),
                    value: show(other),
                });
            }
        };
        if entries.is_empty() {
            return Err(MigPartedError::EmptyConfig(config.clone()));
        }
        let parsed = entries
            .iter()
            .enumerate()
            .map(|(i, e)| parse_entry(config, i, e))
            .collect::<Result<Vec<_>, _>>()?;
        file.mig_configs.insert(config.clone(), parsed);
    }
    Ok(file)
}

fn empty() -> MigPartedFile {
    MigPartedFile {
        version: VERSION.into(),
        mig_configs: BTreeMap::new(),
    }
}

fn parse_entry(config: &str, entry: usize, value: &Value) -> Result<MigPartedEntry, MigPartedError> {
    let fail = |field: &str, problem: EntryProblem| MigPartedError::Entry {
        config: config.to_string(),
        entry,
        field: field.to_string(),
        problem,
    };
    let Value::Object(map) = value else {
        return Err(MigPartedError::EntryNotAMapping {
            config: config.to_string(),
            entry,
            value: show(value),
        });
    };
    // spec.go: `devices` and `mig-enabled` are required; no other fields than the four.
    for required in ["devices", "mig-enabled"] {
        if !map.contains_key(required) {
            return Err(fail(required, EntryProblem::Missing));
        }
    }
    if let Some(field) = map.keys().find(|k| !ENTRY_FIELDS.contains(&k.as_str())) {
        return Err(fail(field, EntryProblem::UnknownField));
    }
    let device_filter = device_filter(map).map_err(|p| fail("device-filter", p))?;
    let devices = devices(&map["devices"]).map_err(|(field, p)| fail(&field, p))?;
    let mig_enabled = match &map["mig-enabled"] {
        Value::Bool(b) => *b,
        other => return Err(fail("mig-enabled", EntryProblem::NotABool(show(other)))),
    };
    let mig_devices = mig_devices(map).map_err(|(field, p)| fail(&field, p))?;
    // spec.go: MIG on needs `mig-devices` (`{}` is fine); MIG off allows none.
    match (&mig_devices, mig_enabled) {
        (None, true) => return Err(fail("mig-devices", EntryProblem::MigDevicesRequired)),
        (Some(d), false) if !d.is_empty() => return Err(fail("mig-devices", EntryProblem::MigDevicesWithoutMig)),
        _ => {}
    }
    Ok(MigPartedEntry {
        device_filter,
        devices,
        mig_enabled,
        mig_devices,
    })
}

/// spec.go: a string or a list of strings. mig-parted does not check that they are PCI IDs (one
/// that does not parse matches no GPU); neither do we, the selector then matches no node.
fn device_filter(map: &Map<String, Value>) -> Result<Option<DeviceFilter>, EntryProblem> {
    match map.get("device-filter") {
        // Go decodes null into "", which is no filter.
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(DeviceFilter::One(s.clone()))),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(|ids| Some(DeviceFilter::Many(ids)))
            .ok_or_else(|| EntryProblem::DeviceFilter(show(&Value::Array(items.clone())))),
        Some(other) => Err(EntryProblem::DeviceFilter(show(other))),
    }
}

/// spec.go: the string `all` or a list of integers. mig-parted reads any `int` (a negative index
/// matches no GPU, an empty list no GPU, a repeated one the same GPU); a plan's device list cannot
/// say these, so they are refused here (ours), as are indices past [`MAX_DEVICE_INDEX`].
fn devices(value: &Value) -> Result<Devices, (String, EntryProblem)> {
    let whole = |p| ("devices".to_string(), p);
    let items = match value {
        Value::String(s) if s == "all" => return Ok(Devices::All),
        Value::Array(items) => items,
        other => return Err(whole(EntryProblem::Devices(show(other)))),
    };
    if items.is_empty() {
        return Err(whole(EntryProblem::NoDevices));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |p| (format!("devices[{i}]"), p);
        let index = match item {
            Value::Number(n) if n.is_i64() || n.is_u64() => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n <= MAX_DEVICE_INDEX)
                .ok_or_else(|| at(EntryProblem::DeviceIndex(n.to_string())))?,
            // A float or a string is not an `int` to Go either.
            other => return Err(whole(EntryProblem::Devices(show(other)))),
        };
        if !seen.insert(index) {
            return Err(at(EntryProblem::DuplicateDevice(index)));
        }
        out.push(index);
    }
    Ok(Devices::List(out))
}

/// mig_config.go `AssertValidFormat`: every key a MIG profile name, no negative count, and not every
/// count 0 unless there are none. A null map is no map, as in Go.
fn mig_devices(map: &Map<String, Value>) -> Result<Option<BTreeMap<String, u32>>, (String, EntryProblem)> {
    let whole = |p| ("mig-devices".to_string(), p);
    let items = match map.get("mig-devices") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(items)) => items,
        Some(other) => return Err(whole(EntryProblem::MigDevices(show(other)))),
    };
    let mut out = BTreeMap::new();
    for (profile, count) in items {
        let at = |p| (format!("mig-devices[{profile:?}]"), p);
        mig_profile_format(profile).map_err(|e| at(EntryProblem::ProfileFormat(e)))?;
        let count = match count {
            Value::Number(n) if n.as_i64().is_some_and(|n| n < 0) => {
                return Err(at(EntryProblem::NegativeCount(n.to_string())));
            }
            Value::Number(n) => n
                .as_u64()
                .filter(|&n| n <= MAX_PROFILE_COUNT)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    at(EntryProblem::Count(match n.as_u64() {
                        Some(_) => format!("{n} (no GPU holds more than {MAX_PROFILE_COUNT} of one profile)"),
                        None => n.to_string(),
                    }))
                })?,
            other => return Err(at(EntryProblem::Count(show(other)))),
        };
        out.insert(profile.clone(), count);
    }
    if !out.is_empty() && out.values().all(|&n| n == 0) {
        return Err(whole(EntryProblem::AllCountsZero));
    }
    Ok(Some(out))
}

/// Is `profile` a MIG profile name as mig-parted reads them: `<g>g.<gb>gb` or `<c>c.<g>g.<gb>gb`,
/// then optionally `+attr[,attr...]` or `-attr[,attr...]` (`1g.10gb+me`, `1c.2g.20gb`)? The format
/// only: whether a GPU model has the profile is the plan checks' business.
pub fn mig_profile_format(profile: &str) -> Result<(), ProfileFormatError> {
    if profile.is_empty() {
        return Err(ProfileFormatError::Empty);
    }
    let plus = profile.split_once('+');
    let minus = profile.split_once('-');
    if plus.is_some() && minus.is_some() {
        return Err(ProfileFormatError::BothAttributeSigns {
            profile: profile.to_string(),
        });
    }
    let (fields, attributes) = plus.or(minus).map_or((profile, None), |(f, a)| (f, Some(a)));
    let parts: Vec<&str> = fields.splitn(3, '.').collect();
    let units: &[&'static str] = match parts.len() {
        3 => &["c", "g", "gb"],
        2 => &["g", "gb"],
        _ => {
            return Err(ProfileFormatError::Fields {
                profile: profile.to_string(),
            });
        }
    };
    for (part, unit) in parts.iter().zip(units) {
        let not_a_number = || ProfileFormatError::Number {
            profile: profile.to_string(),
            part: part.to_string(),
            unit,
        };
        let number = part.strip_suffix(unit).ok_or_else(not_a_number)?;
        // Go's strconv.Atoi: ASCII digits (a sign cannot reach here: + and - start attributes).
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) || number.parse::<i64>().is_err() {
            return Err(not_a_number());
        }
    }
    let Some(attributes) = attributes else {
        return Ok(());
    };
    let mut seen = BTreeSet::new();
    for a in attributes.split(',') {
        let problem = if a.is_empty() {
            Some("an empty attribute")
        } else if !seen.insert(a) {
            Some("an attribute twice")
        } else if a.starts_with(|c: char| c.is_ascii_digit()) {
            Some("an attribute that starts with a digit")
        } else if a.starts_with('.') || a.ends_with('.') {
            Some("an attribute that starts or ends with a dot")
        } else if !a.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
            Some("an attribute with characters other than letters, digits and dots")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(ProfileFormatError::Attribute {
                profile: profile.to_string(),
                problem,
            });
        }
    }
    Ok(())
}

/// A value as it would read in the file, for messages.
fn show(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with one config `c` holding `entries` (YAML flow mappings).
    fn file(entries: &[&str]) -> String {
        let mut s = "version: v1\nmig-configs:\n  c:\n".to_string();
        for e in entries {
            s.push_str(&format!("  - {e}\n"));
        }
        s
    }

    fn err(yaml: &str) -> String {
        MigPartedFile::parse(yaml).unwrap_err().to_string()
    }

    fn entry_err(entry: &str) -> MigPartedError {
        MigPartedFile::parse(&file(&["{devices: all, mig-enabled: false}", entry])).unwrap_err()
    }

    fn problem(entry: &str) -> (String, EntryProblem) {
        match entry_err(entry) {
            MigPartedError::Entry {
                config,
                entry,
                field,
                problem,
            } => {
                assert_eq!((config.as_str(), entry), ("c", 1), "names config and entry");
                (field, problem)
            }
            other => panic!("not an entry error: {other}"),
        }
    }

    // spec.go Spec.UnmarshalJSON

    #[test]
    fn refuses_a_missing_version() {
        assert_eq!(
            err("mig-configs: {c: [{devices: all, mig-enabled: false}]}\n"),
            "version: missing; mig-parted files say `version: v1`"
        );
        assert_eq!(err("{}\n"), "version: missing; mig-parted files say `version: v1`");
    }

    #[test]
    fn refuses_versions_other_than_v1() {
        assert_eq!(
            err("version: v2\n"),
            "version \"v2\" is not supported; mig-parted files say `version: v1`"
        );
        assert!(err("version: 1\n").starts_with("version 1 is not supported"));
        assert!(err("version: V1\n").starts_with("version \"V1\""));
    }

    #[test]
    fn refuses_unknown_top_level_fields() {
        let e = err("version: v1\nbogus: field\nmig-configs: {c: [{devices: all, mig-enabled: false}]}\n");
        assert_eq!(
            e,
            "bogus: unexpected field; a mig-parted file has only `version` and `mig-configs`"
        );
    }

    #[test]
    fn refuses_empty_mig_configs() {
        assert_eq!(
            MigPartedFile::parse("version: v1\nmig-configs: {}\n").unwrap_err(),
            MigPartedError::NoConfigs
        );
        assert_eq!(
            MigPartedFile::parse("version: v1\nmig-configs:\n").unwrap_err(),
            MigPartedError::NoConfigs
        );
        assert!(err("version: v1\nmig-configs: [a]\n").starts_with("mig-configs: must map config names"));
    }

    #[test]
    fn refuses_a_config_without_entries() {
        assert_eq!(
            err("version: v1\nmig-configs: {a: []}\n"),
            "config \"a\": needs at least one entry"
        );
        assert_eq!(
            err("version: v1\nmig-configs: {a: }\n"),
            "config \"a\": needs at least one entry"
        );
        assert!(err("version: v1\nmig-configs: {a: 3}\n").starts_with("config \"a\": must be a list of entries"));
    }

    #[test]
    fn accepts_what_mig_parted_accepts_at_the_top() {
        // mig-parted's own tests "Empty" and "Only version field".
        for text in ["", "version: v1\n"] {
            let f = MigPartedFile::parse(text).unwrap();
            assert!(f.mig_configs.is_empty());
            assert_eq!(crate::migparted::import(&f, None).unwrap(), vec![]);
        }
        assert!(err("[1, 2]\n").starts_with("a mig-parted file is a mapping"));
        assert!(err("version: [\n").starts_with("not YAML"));
    }

    // spec.go MigConfigSpec.UnmarshalJSON

    #[test]
    fn refuses_an_entry_that_is_not_a_mapping() {
        let e = entry_err("all");
        assert_eq!(
            e.to_string(),
            "config \"c\" entry 1: an entry is a mapping of devices, mig-enabled, mig-devices and device-filter, not \"all\""
        );
    }

    #[test]
    fn refuses_missing_devices_or_mig_enabled() {
        assert_eq!(
            problem("{mig-enabled: false}"),
            ("devices".into(), EntryProblem::Missing)
        );
        assert_eq!(problem("{devices: all}"), ("mig-enabled".into(), EntryProblem::Missing));
        assert_eq!(
            entry_err("{devices: all}").to_string(),
            "config \"c\" entry 1: mig-enabled: required"
        );
    }

    #[test]
    fn refuses_unknown_entry_fields() {
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devicez: {}}"),
            ("mig-devicez".into(), EntryProblem::UnknownField)
        );
    }

    #[test]
    fn refuses_a_device_filter_that_is_not_strings() {
        assert_eq!(
            problem("{devices: all, mig-enabled: false, device-filter: {a: 1}}"),
            ("device-filter".into(), EntryProblem::DeviceFilter("{\"a\":1}".into()))
        );
        assert_eq!(
            problem("{devices: all, mig-enabled: false, device-filter: [\"0x233010DE\", 7]}").0,
            "device-filter"
        );
    }

    #[test]
    fn refuses_devices_other_than_all_or_indices() {
        assert_eq!(
            problem("{devices: bogus, mig-enabled: false}"),
            ("devices".into(), EntryProblem::Devices("\"bogus\"".into()))
        );
        assert_eq!(
            problem("{devices: {}, mig-enabled: false}").1,
            EntryProblem::Devices("{}".into())
        );
        assert_eq!(
            problem("{devices: [0, 1.5], mig-enabled: false}").1,
            EntryProblem::Devices("1.5".into())
        );
        assert_eq!(
            problem("{devices: [\"0\"], mig-enabled: false}").1,
            EntryProblem::Devices("\"0\"".into())
        );
    }

    /// Ours: mig-parted reads any Go `int`; a plan's device list cannot name these.
    #[test]
    fn refuses_device_lists_a_plan_cannot_express() {
        assert_eq!(
            problem("{devices: [0, -1], mig-enabled: false}"),
            ("devices[1]".into(), EntryProblem::DeviceIndex("-1".into()))
        );
        assert_eq!(
            problem("{devices: [64], mig-enabled: false}").1,
            EntryProblem::DeviceIndex("64".into())
        );
        assert_eq!(
            problem("{devices: [2, 0, 2], mig-enabled: false}"),
            ("devices[2]".into(), EntryProblem::DuplicateDevice(2))
        );
        assert_eq!(
            problem("{devices: [], mig-enabled: false}"),
            ("devices".into(), EntryProblem::NoDevices)
        );
        assert_eq!(
            entry_err("{devices: [0, -1], mig-enabled: false}").to_string(),
            "config \"c\" entry 1: devices[1]: -1 is not a GPU index (0-63)"
        );
    }

    #[test]
    fn refuses_a_mig_enabled_that_is_not_a_bool() {
        assert_eq!(
            problem("{devices: all, mig-enabled: \"true\"}"),
            ("mig-enabled".into(), EntryProblem::NotABool("\"true\"".into()))
        );
    }

    #[test]
    fn refuses_mig_on_without_mig_devices() {
        assert_eq!(
            problem("{devices: all, mig-enabled: true}"),
            ("mig-devices".into(), EntryProblem::MigDevicesRequired)
        );
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: }").1,
            EntryProblem::MigDevicesRequired
        );
        // `{}` is MIG on with no instances.
        let f = MigPartedFile::parse(&file(&["{devices: all, mig-enabled: true, mig-devices: {}}"])).unwrap();
        assert_eq!(f.mig_configs["c"][0].mig_devices, Some(BTreeMap::new()));
    }

    #[test]
    fn refuses_mig_devices_with_mig_off() {
        assert_eq!(
            problem("{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}"),
            ("mig-devices".into(), EntryProblem::MigDevicesWithoutMig)
        );
        assert!(MigPartedFile::parse(&file(&["{devices: all, mig-enabled: false, mig-devices: {}}"])).is_ok());
    }

    #[test]
    fn refuses_mig_devices_that_are_not_a_mapping() {
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: [1g.10gb]}"),
            ("mig-devices".into(), EntryProblem::MigDevices("[\"1g.10gb\"]".into()))
        );
    }

    // mig_config.go AssertValidFormat

    #[test]
    fn refuses_malformed_profile_names() {
        let (field, p) = problem("{devices: all, mig-enabled: true, mig-devices: {bogus: 2}}");
        assert_eq!(field, "mig-devices[\"bogus\"]");
        assert!(matches!(p, EntryProblem::ProfileFormat(_)), "{p}");
        assert_eq!(
            entry_err("{devices: all, mig-enabled: true, mig-devices: {bogus: 2}}").to_string(),
            "config \"c\" entry 1: mig-devices[\"bogus\"]: not a MIG profile name: \"bogus\" is not <g>g.<gb>gb or <c>c.<g>g.<gb>gb"
        );
    }

    #[test]
    fn refuses_negative_counts() {
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}"),
            (
                "mig-devices[\"1g.10gb\"]".into(),
                EntryProblem::NegativeCount("-1".into())
            )
        );
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 1.5}}").1,
            EntryProblem::Count("1.5".into())
        );
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: {1g.10gb: x}}").1,
            EntryProblem::Count("\"x\"".into())
        );
    }

    #[test]
    fn refuses_all_counts_zero() {
        assert_eq!(
            problem("{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0, 2g.20gb: 0}}"),
            ("mig-devices".into(), EntryProblem::AllCountsZero)
        );
        // One count above 0 is enough; the zero one adds no instance.
        let f = MigPartedFile::parse(&file(&[
            "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0, 2g.20gb: 1}}",
        ]))
        .unwrap();
        assert_eq!(
            crate::migparted::expand_mig_devices(f.mig_configs["c"][0].mig_devices.as_ref().unwrap()),
            ["2g.20gb"]
        );
    }

    /// go-nvlib `parseMigProfile`, case by case.
    #[test]
    fn profile_name_format() {
        for ok in [
            "1g.5gb",
            "7g.80gb",
            "1g.10gb+me",
            "1c.2g.20gb",
            "1c.1g.5gb+me",
            "1g.24gb-me",
            "1g.24gb+gfx",
            "1g.5gb+me,x.y",
            "0g.0gb",
        ] {
            assert_eq!(mig_profile_format(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("1g.5gb+me-x", "both + and -"),
            ("1g", "is not <g>g.<gb>gb"),
            ("1g.5gb.x", "\"1g\" should be a number followed by \"c\""),
            ("g.5gb", "\"g\" should be a number"),
            ("1x.5gb", "\"1x\" should be a number followed by \"g\""),
            ("1g.5GB", "\"5GB\" should be a number followed by \"gb\""),
            ("1g. 5gb", "should be a number"),
            ("1g.5gb+", "an empty attribute"),
            ("1g.5gb+me,me", "an attribute twice"),
            ("1g.5gb+2x", "starts with a digit"),
            ("1g.5gb+.me", "starts or ends with a dot"),
            ("1g.5gb+m_e", "other than letters"),
            ("99999999999999999999g.5gb", "should be a number"),
        ] {
            let e = mig_profile_format(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
