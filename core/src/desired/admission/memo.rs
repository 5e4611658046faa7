//! Each tenant's two admission policies (pods, claims) as the last pass rendered them, for the
//! next pass to take back when nothing they are made of changed (ISSUE 18, item 4: writing each
//! tenant's CEL rules was 46% of the desired state's work per pass at 5,000 nodes).
//!
//! The two policies are a pure function of the tenant's name, its [`PolicyRules`] (not its grants,
//! which they read from the tenant's status as their parameter) and the
//! controller's [`Settings`]: a policy is taken back only when the rules compare equal to those it
//! was rendered from, and every policy is forgotten when the settings differ. A tenant absent from
//! a pass is forgotten. `operator/tests/incremental.rs` holds the desired state rendered with the
//! memo equal to one rendered from nothing after random changes.

use super::rules::PolicyRules;
use crate::desired::Settings;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use std::collections::HashMap;
use std::sync::Arc;

/// One tenant's policies and the rules they were rendered from. Shared with the passes' output
/// (and the controller's diff, which keeps what it found written): one copy of a tenant's CEL
/// text, however many passes take it back.
struct Rendered {
    rules: PolicyRules,
    pods: Arc<ValidatingAdmissionPolicy>,
    claims: Arc<ValidatingAdmissionPolicy>,
}

/// The tenants' policies of the last pass, by tenant name, and the settings they were rendered
/// under.
#[derive(Default)]
pub struct AdmissionMemo {
    settings: Option<Settings>,
    tenants: HashMap<String, Rendered>,
}

impl AdmissionMemo {
    /// The last pass's policies, when they were rendered under `settings`; nothing otherwise.
    fn take(&mut self, settings: &Settings) -> HashMap<String, Rendered> {
        let tenants = std::mem::take(&mut self.tenants);
        if self.settings.as_ref() == Some(settings) {
            tenants
        } else {
            self.settings = Some(settings.clone());
            HashMap::new()
        }
    }

    /// Keeps this pass's policies (rendered under the settings of [`AdmissionMemo::take`]).
    fn keep(&mut self, tenants: HashMap<String, Rendered>) {
        self.tenants = tenants;
    }
}

/// One pass's use of the memo: the last pass's policies to take back, this pass's to keep.
pub(super) struct Pass<'m> {
    memo: Option<&'m mut AdmissionMemo>,
    last: HashMap<String, Rendered>,
    kept: HashMap<String, Rendered>,
}

impl<'m> Pass<'m> {
    pub fn start(mut memo: Option<&'m mut AdmissionMemo>, settings: &Settings) -> Pass<'m> {
        let last = memo.as_deref_mut().map(|m| m.take(settings)).unwrap_or_default();
        Pass {
            memo,
            last,
            kept: HashMap::new(),
        }
    }

    /// The tenant's two policies (pods, claims): the last pass's when its rules are equal to
    /// those they were rendered from, `render`'s otherwise.
    pub fn policies(
        &mut self,
        name: String,
        rules: PolicyRules,
        render: impl FnOnce(&str, &PolicyRules) -> [ValidatingAdmissionPolicy; 2],
    ) -> [Arc<ValidatingAdmissionPolicy>; 2] {
        let [pods, claims] = match self.last.remove(&name) {
            Some(r) if r.rules == rules => [r.pods, r.claims],
            _ => render(&name, &rules).map(Arc::new),
        };
        if self.memo.is_none() {
            return [pods, claims];
        }
        let out = [pods.clone(), claims.clone()];
        self.kept.insert(name, Rendered { rules, pods, claims });
        out
    }

    /// Keeps this pass's policies for the next.
    pub fn finish(self) {
        if let Some(m) = self.memo {
            m.keep(self.kept);
        }
    }
}
