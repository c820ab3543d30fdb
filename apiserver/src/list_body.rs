//! List responses streamed into the response body a chunk at a time.
//!
//! A list page is made of stored entries the store already holds (`Arc<Entry>`): the body is
//! `head item,item,… tail`, and each item is rendered only when the client has taken the
//! chunks before it. So whatever the page's size, a request holds at most one chunk of
//! rendered output and one item's decoded value — not a copy of the page, nor (for a Table
//! with `includeObject=Object`, or `as=PartialObjectMetadata`) a decoded copy of every object
//! at once. Items that need decoding (Table rows, metadata, version conversion) are rendered on
//! a blocking thread one chunk at a time; the thread is never held while the client reads.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

use serde_json::{Value, json};

use crate::storage::Entry;

/// A chunk is sent once it holds this many bytes (or the page ends).
pub const CHUNK: usize = 64 * 1024;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Renders one item of the page.
pub type Render = Arc<dyn Fn(&Entry) -> Vec<u8> + Send + Sync>;

/// Charges the decoding of one chunk: called with the stored size of the chunk's largest item,
/// it returns what holds the charge while the chunk is made, or None when the budget has no
/// room now.
pub type Charge = Arc<dyn Fn(usize) -> Option<Box<dyn Send>> + Send + Sync>;

/// How long a chunk waits for room in the budget before the body is cut off.
const CHARGE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

struct Page {
    head: Option<Vec<u8>>,
    tail: &'static [u8],
    entries: Vec<Arc<Entry>>,
    next: usize,
    render: Render,
    done: bool,
}

impl Page {
    /// The stored size of the largest item the next chunk will likely take.
    fn next_largest(&self) -> usize {
        let mut taken = 0;
        let mut largest = 0;
        for e in self.entries.iter().skip(self.next) {
            largest = largest.max(e.bytes.len());
            taken += e.bytes.len();
            if taken >= CHUNK {
                break;
            }
        }
        largest
    }

    /// The next chunk: items from `next` until the chunk is full or the page ends.
    fn chunk(&mut self) -> Vec<u8> {
        let mut out = self.head.take().unwrap_or_default();
        // A chunk also ends once it has taken CHUNK stored bytes: exactly the items
        // [`Page::next_largest`] looked at when the chunk was charged (rendered rows can be far
        // smaller than the objects they are made from).
        let mut stored = 0;
        while self.next < self.entries.len() && out.len() < CHUNK && stored < CHUNK {
            stored += self.entries[self.next].bytes.len();
            if self.next > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&(self.render)(&self.entries[self.next]));
            self.next += 1;
        }
        if self.next == self.entries.len() {
            out.extend_from_slice(self.tail);
            self.done = true;
        }
        out
    }
}

/// A streamed body `head` + the items rendered by `render`, comma-separated, + `tail`.
/// `blocking`: render on a blocking thread (items that are decoded); otherwise inline (items
/// that are copied as stored).
/// With `charge`, each chunk made on a blocking thread is charged while it is made (the charge
/// is not held while the client reads: a client that stops reading holds no budget); a chunk
/// that finds no room within [`CHARGE_WAIT`] ends the body early (the client sees a cut-off
/// list and retries).
pub fn streamed(
    head: Vec<u8>,
    tail: &'static [u8],
    entries: Vec<Arc<Entry>>,
    render: Render,
    blocking: bool,
    charge: Option<Charge>,
) -> Body {
    let page = Page { head: Some(head), tail, entries, next: 0, render, done: false };
    let stream = futures::stream::unfold(Some(page), move |page| {
        let charge = charge.clone();
        async move {
            let mut page = page?;
            if page.done {
                return None;
            }
            let held = match &charge {
                Some(charge) if blocking => {
                    let largest = page.next_largest();
                    let deadline = tokio::time::Instant::now() + CHARGE_WAIT;
                    loop {
                        if let Some(h) = charge(largest) {
                            break Some(h);
                        }
                        if tokio::time::Instant::now() >= deadline {
                            tracing::info!(largest, "cutting off a list: no decode budget to make its next chunk");
                            return None;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
                _ => None,
            };
            let (chunk, page) = if blocking {
                match tokio::task::spawn_blocking(move || {
                    let _held = held;
                    (page.chunk(), page)
                })
                .await
                {
                    Ok(r) => r,
                    // A panic while rendering ends the body (the client sees a truncated list and
                    // fails to decode it) rather than the server.
                    Err(_) => return None,
                }
            } else {
                (page.chunk(), page)
            };
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), Some(page)))
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

/// A stored object as `PartialObjectMetadata` (metadata without managedFields). Only the
/// metadata is decoded: the rest of the object is skipped, not built.
pub fn partial_object(stored: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(default)]
        metadata: Value,
    }
    let mut md = serde_json::from_slice::<Metadata>(stored).map(|m| m.metadata).unwrap_or_default();
    if let Some(m) = md.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": md})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, pad: usize) -> Arc<Entry> {
        let v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"x": "y".repeat(pad)}});
        Arc::new(Entry::for_test(&v))
    }

    async fn collect(body: Body) -> (Vec<usize>, Vec<u8>) {
        let mut sizes = vec![];
        let mut all = vec![];
        let mut body = body;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(d) = frame.into_data() {
                sizes.push(d.len());
                all.extend_from_slice(&d);
            }
        }
        (sizes, all)
    }

    #[tokio::test]
    async fn a_page_is_sent_in_chunks_and_is_the_same_json() -> anyhow::Result<()> {
        let entries: Vec<_> = (0..40).map(|i| entry(&format!("c{i}"), 10_000)).collect();
        for blocking in [false, true] {
            let render: Render = Arc::new(|e: &Entry| e.bytes.to_vec());
            let body = streamed(b"{\"items\":[".to_vec(), b"]}", entries.clone(), render, blocking, None);
            let (sizes, all) = collect(body).await;
            assert!(sizes.len() >= 5, "40 items of 10 kB in 64 KiB chunks: {sizes:?}");
            assert!(sizes.iter().all(|s| *s < CHUNK + 11_000), "no chunk over a chunk plus one item: {sizes:?}");
            let v: Value = serde_json::from_slice(&all)?;
            assert_eq!(v["items"].as_array().map(Vec::len), Some(40));
            assert_eq!(v["items"][39]["metadata"]["name"], "c39");
        }
        Ok(())
    }

    #[tokio::test]
    async fn an_empty_page_is_head_and_tail() -> anyhow::Result<()> {
        let render: Render = Arc::new(|e: &Entry| e.bytes.to_vec());
        let (_, all) = collect(streamed(b"{\"items\":[".to_vec(), b"]}", vec![], render, true, None)).await;
        assert_eq!(serde_json::from_slice::<Value>(&all)?, json!({"items": []}));
        Ok(())
    }
    #[tokio::test]
    async fn every_item_a_chunk_decodes_is_covered_by_its_charge() -> anyhow::Result<()> {
        // A small object first, then large ones whose rows render small (a Table without the
        // object): each chunk's charge must cover the largest object it decodes.
        let mut entries = vec![entry("small", 70_000)];
        entries.extend((0..6).map(|i| entry(&format!("large{i}"), 300_000)));
        let charged: Arc<std::sync::Mutex<Vec<usize>>> = Arc::default();
        let decoded: Arc<std::sync::Mutex<Vec<(usize, usize)>>> = Arc::default();
        let (c, d) = (charged.clone(), decoded.clone());
        let charge: Charge = Arc::new(move |largest| {
            c.lock().map(|mut v| v.push(largest)).ok()?;
            Some(Box::new(()) as Box<dyn Send>)
        });
        let render: Render = Arc::new(move |e: &Entry| {
            let _ = d.lock().map(|mut v| v.push((e.bytes.len(), 0)));
            b"{}".to_vec()
        });
        let (sizes, _) = collect(streamed(b"{\"rows\":[".to_vec(), b"]}", entries, render, true, Some(charge))).await;
        let charged = charged.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(charged.len(), sizes.len(), "one charge per chunk: {charged:?} {sizes:?}");
        assert!(charged.iter().skip(1).all(|c| *c >= 300_000), "every chunk after the first holds a large object: {charged:?}");
        assert!(charged[0] >= 70_000 && charged.len() >= 6, "{charged:?}");
        Ok(())
    }
}
