//! A list shared between holders until one of them changes it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;

/// A `Vec` whose clones share one allocation until one of them is changed (copy on write,
/// [`Arc::make_mut`]): the planner's memo, its output and the next pass hold the same GPU list of
/// a node that no change reached, instead of a copy each (copying and freeing every node's GPUs
/// was a fifth of a tenant change at 5,000 nodes). Reads and changes as the `Vec`; serialised, and
/// in the CRD schema, exactly as the list. Equal when the lists are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedVec<T>(Arc<Vec<T>>);

impl<T> Default for SharedVec<T> {
    fn default() -> SharedVec<T> {
        SharedVec(Arc::new(Vec::new()))
    }
}

impl<T> SharedVec<T> {
    /// For `skip_serializing_if`, which names a function rather than a method through `Deref`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether both hold the same allocation (so are equal without looking).
    pub fn same_list(&self, other: &SharedVec<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> std::ops::Deref for SharedVec<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

/// A change copies the list first when another holder still has it.
impl<T: Clone> std::ops::DerefMut for SharedVec<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<Vec<T>> for SharedVec<T> {
    fn from(v: Vec<T>) -> SharedVec<T> {
        SharedVec(Arc::new(v))
    }
}

impl<T: Clone> From<SharedVec<T>> for Vec<T> {
    fn from(v: SharedVec<T>) -> Vec<T> {
        Arc::unwrap_or_clone(v.0)
    }
}

impl<T> FromIterator<T> for SharedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> SharedVec<T> {
        SharedVec(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a, T> IntoIterator for &'a SharedVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a, T: Clone> IntoIterator for &'a mut SharedVec<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        Arc::make_mut(&mut self.0).iter_mut()
    }
}

impl<T: Clone> IntoIterator for SharedVec<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        Arc::unwrap_or_clone(self.0).into_iter()
    }
}

impl<T: Serialize> Serialize for SharedVec<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for SharedVec<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SharedVec<T>, D::Error> {
        Vec::<T>::deserialize(deserializer).map(SharedVec::from)
    }
}

impl<T: JsonSchema> JsonSchema for SharedVec<T> {
    fn schema_name() -> Cow<'static, str> {
        <Vec<T>>::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        <Vec<T>>::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <Vec<T>>::json_schema(generator)
    }

    fn inline_schema() -> bool {
        <Vec<T>>::inline_schema()
    }
}

#[cfg(test)]
mod tests {
    use super::SharedVec;

    #[test]
    fn a_change_copies_a_list_another_holder_has_and_only_then() {
        let a: SharedVec<u32> = vec![1, 2].into();
        let mut b = a.clone();
        assert!(a.same_list(&b));
        b[0] = 1; // a change, even to the same value, copies: holders never see each other's
        assert!(!a.same_list(&b));
        b.push(3);
        assert_eq!(*a, vec![1, 2]);
        assert_eq!(*b, vec![1, 2, 3]);
        let only = b.as_ptr();
        b[1] = 5; // b's list is its own now: changed in place
        assert_eq!(b.as_ptr(), only);
        assert_eq!(serde_json::to_string(&b).unwrap(), "[1,5,3]");
        let back: SharedVec<u32> = serde_json::from_str("[1,5,3]").unwrap();
        assert_eq!(back, b);
    }
}
