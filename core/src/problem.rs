//! A problem with user input: which object, which field, what is wrong and what to do.

use serde::Serialize;
use std::fmt;

#[derive(Serialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// `Kind/name`, e.g. `GpuTenant/acme`.
    pub object: String,
    /// Field path, e.g. `spec.resources[1].profile`.
    pub field: String,
    /// A sentence a person can act on.
    pub message: String,
}

impl Problem {
    pub fn new(kind: &str, name: &str, field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            object: format!("{kind}/{name}"),
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}
