//! Objects the controller owns completely (quotas, admission policies, the device plugin's
//! ConfigMap, DeviceClasses, tenant namespaces): applied where the live object lacks a desired
//! field, deleted where no longer desired.
//!
//! Whether the live object holds every desired field is found by serialising both and comparing
//! them ([`contains`]): the API server adds defaults and metadata, so typed equality would see
//! differences that are none. That is most of a pass's diff (thousands of admission policies and
//! quotas at fleet size), so each finding is kept ([`Contained`]): while the live object has the
//! same resourceVersion and the desired object is equal to the one found contained, it still
//! contains it. A resourceVersion names one state of one object on the API server; an object
//! without one (not read from an API server) is always compared.

use super::write::{Kind, Write};
use crate::controller::kinds::owned_kinds;
use crate::runtime::object::contains;
use kube::Resource;
use serde::Serialize;
use serde_json::Value;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// An object's namespace and name.
type Key = (Option<String>, String);

fn key_of<T: Resource>(o: &T) -> Key {
    (o.meta().namespace.clone(), o.meta().name.clone().unwrap_or_default())
}

pub(super) fn to_value<T: Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("Kubernetes objects serialise")
}

/// Per object of one kind, the live resourceVersion last found to contain the desired object,
/// and that desired object. Only objects desired in the last pass are kept.
#[derive(Debug)]
pub struct Contained<T> {
    found: HashMap<Key, (String, T)>,
}

impl<T> Default for Contained<T> {
    fn default() -> Self {
        Contained { found: HashMap::new() }
    }
}

impl<T> Contained<T> {
    pub(super) fn len(&self) -> usize {
        self.found.len()
    }
}

/// Applies of `desired` objects the live set does not contain, and deletes of owned live objects
/// no longer desired. Objects are keyed by namespace and name; `seen` is what the last pass found
/// contained, and becomes what this one found. A desired object may be shared (`Arc`): `seen`
/// then holds another reference to it, not a copy.
pub(super) fn owned<'d, D, T, L>(
    kind: Kind,
    desired: impl IntoIterator<Item = &'d D>,
    live: &[L],
    seen: &mut Contained<D>,
    out: &mut Vec<Write>,
    deletes: &mut Vec<Write>,
) where
    D: Borrow<T> + PartialEq + Clone + 'd,
    L: Borrow<T>,
    T: Resource + Serialize,
{
    let live: BTreeMap<Key, &T> = live.iter().map(|l| (key_of(l.borrow()), l.borrow())).collect();
    let mut last = std::mem::take(&mut seen.found);
    let mut wanted = BTreeSet::new();
    for d in desired {
        let key = key_of(d.borrow());
        let l = live.get(&key);
        let version = l.and_then(|l| l.meta().resource_version.as_deref());
        let still = match (version, last.remove(&key)) {
            (Some(v), Some((was, object))) if was == v && object == *d => Some((was, object)),
            _ => None,
        };
        if let Some(found) = still {
            seen.found.insert(key.clone(), found);
        } else {
            let want = to_value(d.borrow());
            if l.is_some_and(|l| contains(&to_value(*l), &want)) {
                if let Some(v) = version {
                    seen.found.insert(key.clone(), (v.to_string(), d.clone()));
                }
            } else {
                out.push(Write::Apply {
                    kind,
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    object: want,
                });
            }
        }
        wanted.insert(key);
    }
    for (key, _) in live.iter().filter(|(k, _)| !wanted.contains(*k)) {
        deletes.push(Write::Delete {
            kind,
            namespace: key.0.clone(),
            name: key.1.clone(),
        });
    }
}

/// What a pass keeps of each kind written whole (the table's rows with `seen`,
/// [`crate::controller::kinds::owned_kinds`]).
macro_rules! seen {
    ($( $kind:ident {
        ty: $ty:ty,
        live: $field:ident $held:ident,
        watch: $scope:ident $which:ident,
        write: $write:ident $desired:ident,
        $(seen: $seen:ty,)?
        plan: $plan:ident,
        optional: $optional:literal,
    } )*) => {
        /// What a pass found already so in the owned objects, kept for the next pass
        /// ([`owned()`]), and when it wrote the bookkeeping that may wait for the nodes
        /// ([`super::hold`]).
        #[derive(Debug, Default)]
        pub struct Seen {
            pub(super) recent: super::hold::Recent,
            $($(pub(super) $field: Contained<$seen>,)?)*
        }

        impl Seen {
            /// How many owned objects the last pass found contained in their live ones.
            pub fn len(&self) -> usize {
                // `$seen` names the rows that have a `seen` (the repetition needs it); the sum
                // is of their fields.
                0 $($(+ { let _: Option<$seen> = None; self.$field.len() })?)*
            }
        }
    };
}

owned_kinds!(seen);

impl Seen {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
