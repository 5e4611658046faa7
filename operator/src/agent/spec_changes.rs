//! The production agent's source of spec changes: its watch on its own GpuNode, as
//! [`super::run_node`] reads it. `Some(gpu_node)` for the GpuNode as the watch sees it now (a pass
//! for a new generation takes its spec from it, [`super::known`]), `None` when it is gone: deleted
//! while watched, or missing from a watch's new list though it was there before (a deletion while
//! the watch was down sends no event of its own). Then the next pass reads it again, and creates it
//! if it is missing; polls read nothing, so without this an agent whose GpuNode was deleted would
//! not notice until a write of its failed.

use crate::api::GpuNode;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

/// What the watch has said of the GpuNode: whether it exists, and whether the list in progress
/// (after `Init`) has shown it.
#[derive(Default)]
struct Seen {
    present: bool,
    listed: bool,
}

impl Seen {
    /// The GpuNode (or `None`, gone) an event tells of, if it tells anything.
    fn read(&mut self, event: Event<GpuNode>) -> Option<Option<GpuNode>> {
        match event {
            Event::Apply(n) | Event::InitApply(n) => {
                self.present = true;
                self.listed = true;
                Some(Some(n))
            }
            Event::Delete(_) => {
                self.present = false;
                Some(None)
            }
            Event::Init => {
                self.listed = false;
                None
            }
            // At start nothing was there before (the first pass creates it): no change to tell.
            Event::InitDone if self.present && !self.listed => {
                self.present = false;
                Some(None)
            }
            Event::InitDone => None,
        }
    }
}

/// The GpuNode as `events` (a watch on it) bring it, `None` for it gone; watch errors as they
/// come (the watch retries them with its backoff).
pub fn spec_changes(
    events: impl Stream<Item = Result<Event<GpuNode>, watcher::Error>>,
) -> impl Stream<Item = Result<Option<GpuNode>, watcher::Error>> {
    events
        .scan(Seen::default(), |seen, event| {
            let told = match event {
                Ok(e) => seen.read(e).map(Ok),
                Err(e) => Some(Err(e)),
            };
            std::future::ready(Some(told))
        })
        .filter_map(std::future::ready)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    fn node(generation: i64) -> GpuNode {
        let mut n = GpuNode::new("n1", Default::default());
        n.metadata.generation = Some(generation);
        n
    }

    /// The generations told, `None` for the GpuNode gone.
    fn told(events: Vec<Event<GpuNode>>) -> Vec<Option<i64>> {
        let out: Vec<_> = block_on(spec_changes(futures::stream::iter(events.into_iter().map(Ok))).collect());
        out.into_iter()
            .map(|r| {
                r.expect("no watch error")
                    .map(|n| n.metadata.generation.expect("a generation"))
            })
            .collect()
    }

    #[test]
    fn a_start_on_a_missing_gpunode_tells_nothing_until_it_is_created() {
        assert_eq!(
            told(vec![Event::Init, Event::InitDone, Event::Apply(node(1))]),
            vec![Some(1)]
        );
    }

    #[test]
    fn every_listed_and_changed_generation_is_told() {
        let events = vec![
            Event::Init,
            Event::InitApply(node(3)),
            Event::InitDone,
            Event::Apply(node(4)),
        ];
        assert_eq!(told(events), vec![Some(3), Some(4)]);
    }

    #[test]
    fn a_deletion_is_told_as_none() {
        let events = vec![
            Event::Init,
            Event::InitApply(node(2)),
            Event::InitDone,
            Event::Delete(node(2)),
        ];
        assert_eq!(told(events), vec![Some(2), None]);
    }

    #[test]
    fn a_deletion_missed_while_the_watch_was_down_is_told_by_the_next_list() {
        let events = vec![
            Event::Init,
            Event::InitApply(node(2)),
            Event::InitDone,
            // The watch restarts; the GpuNode was deleted meanwhile.
            Event::Init,
            Event::InitDone,
            // And once more: gone already, nothing new to tell.
            Event::Init,
            Event::InitDone,
        ];
        assert_eq!(told(events), vec![Some(2), None]);
    }

    #[test]
    fn a_relist_that_shows_it_again_tells_its_generation() {
        let events = vec![
            Event::Init,
            Event::InitApply(node(2)),
            Event::InitDone,
            Event::Init,
            Event::InitApply(node(2)),
            Event::InitDone,
        ];
        assert_eq!(told(events), vec![Some(2), Some(2)]);
    }

    #[test]
    fn watch_errors_are_passed_on() {
        let events = futures::stream::iter(vec![Err(watcher::Error::NoResourceVersion), Ok(Event::Apply(node(1)))]);
        let out: Vec<_> = block_on(spec_changes(events).collect());
        assert!(matches!(&out[0], Err(watcher::Error::NoResourceVersion)), "{out:?}");
        assert!(
            matches!(&out[1], Ok(Some(n)) if n.metadata.generation == Some(1)),
            "{out:?}"
        );
    }
}
