//! Which tenant a namespace belongs to: the one GpuTenant that lists it in `spec.namespaces`. A
//! namespace two tenants list is no tenant's (the check of tenants marks both invalid until one
//! lets go), and so is a namespace exempt from the admission policies. Admission binds its rules
//! by this, the DRA driver's Prepare hands devices by it, and the agent attributes processes by
//! it: written once, here, so the three cannot drift apart.

use crate::api::GpuTenant;
use std::borrow::Borrow;
use std::collections::BTreeSet;

/// Every namespace the tenants list, with the tenants that list it (in the tenants' order).
/// Names are borrowed and hashed: a fleet's tenants list thousands of namespaces.
pub struct NamespaceOwners<'a> {
    listers: foldhash::HashMap<&'a str, Vec<&'a str>>,
}

impl<'a> NamespaceOwners<'a> {
    pub fn of<T: Borrow<GpuTenant>>(tenants: &'a [T]) -> NamespaceOwners<'a> {
        let mut listers: foldhash::HashMap<&'a str, Vec<&'a str>> = foldhash::HashMap::default();
        for t in tenants {
            let t: &'a GpuTenant = t.borrow();
            let name = crate::api::name_of(t);
            for ns in &t.spec.namespaces {
                listers.entry(ns.as_str()).or_default().push(name);
            }
        }
        NamespaceOwners { listers }
    }

    /// The tenants that list `namespace`.
    pub fn listers(&self, namespace: &str) -> &[&'a str] {
        self.listers.get(namespace).map_or(&[], Vec::as_slice)
    }

    /// The tenant `namespace` belongs to: the one that lists it, unless it is `exempt`.
    pub fn owner(&self, namespace: &str, exempt: &BTreeSet<String>) -> Option<&'a str> {
        match self.listers(namespace) {
            [only] if !exempt.contains(namespace) => Some(*only),
            _ => None,
        }
    }

    /// Every listed namespace with its owner, if it has one.
    pub fn owners<'s>(&'s self, exempt: &'s BTreeSet<String>) -> impl Iterator<Item = (&'a str, Option<&'a str>)> + 's {
        self.listers.keys().map(move |ns| (*ns, self.owner(ns, exempt)))
    }
}

/// [`NamespaceOwners::owner`] for one namespace.
pub fn owner_of<'a, T: Borrow<GpuTenant>>(
    tenants: &'a [T],
    namespace: &str,
    exempt: &BTreeSet<String>,
) -> Option<&'a str> {
    let mut listing = tenants
        .iter()
        .map(Borrow::borrow)
        .filter(|t: &&GpuTenant| t.spec.namespaces.iter().any(|n| n == namespace));
    match (listing.next(), listing.next()) {
        (Some(t), None) if !exempt.contains(namespace) => Some(crate::api::name_of(t)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuTenantSpec;

    fn tenant(name: &str, namespaces: &[&str]) -> GpuTenant {
        GpuTenant::new(
            name,
            GpuTenantSpec {
                tier: "internal".into(),
                policy_ref: "default".into(),
                namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
                priority: 0,
                weight: 1,
                resources: vec![],
                limits: None,
            },
        )
    }

    /// One lister owns it; two listers, an exempt namespace or none: no owner. The bulk and the
    /// one-off answers agree on every namespace.
    #[test]
    fn a_namespace_belongs_to_the_one_tenant_that_lists_it() {
        let tenants = [
            tenant("a", &["a-prod", "shared", "kube-system"]),
            tenant("b", &["b-prod", "shared"]),
        ];
        let exempt = BTreeSet::from(["kube-system".to_string()]);
        let owners = NamespaceOwners::of(&tenants);
        let want = [
            ("a-prod", Some("a")),
            ("b-prod", Some("b")),
            ("shared", None),
            ("kube-system", None),
            ("elsewhere", None),
        ];
        for (ns, owner) in want {
            assert_eq!(owners.owner(ns, &exempt), owner, "{ns}");
            assert_eq!(owner_of(&tenants, ns, &exempt), owner, "{ns}");
        }
        assert_eq!(owners.listers("shared"), ["a", "b"]);
        assert_eq!(owner_of(&tenants, "kube-system", &BTreeSet::new()), Some("a"));
        assert_eq!(owners.owners(&exempt).filter(|(_, o)| o.is_some()).count(), 2);
    }
}
