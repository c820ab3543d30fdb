//! Objects listed for display (the web console, `provisioning trace`): page by page, each
//! object and the whole listing within a decode budget, a few listings at a time.

use kube::Api;
use kube::api::ListParams;
use provisioning_controller::decode::BoundedObject;
use serde_json::Value;

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// The API server's answer.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// Anything else (busy, a malformed answer).
    #[error("{0}")]
    Other(String),
}

/// Listings the console decodes at once, all visitors together.
static LISTINGS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
/// How long a page waits for a listing turn before it answers "busy".
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A listing turn, or "busy" after [`TURN_WAIT`]: a visitor loading many pages at once makes
/// others wait at most that long, never without end.
pub async fn turn() -> Result<tokio::sync::SemaphorePermit<'static>, ListingError> {
    match tokio::time::timeout(TURN_WAIT, LISTINGS.acquire()).await {
        Ok(Ok(turn)) => Ok(turn),
        Ok(Err(_)) => Err(ListingError::Other("the console is stopping".into())),
        Err(_) => Err(ListingError::Other("the console is busy reading other pages; try again in a moment".into())),
    }
}

/// Objects per page of a listing (each at most the API server's object size as text).
const PAGE: u32 = 10;
/// Objects of one listing shown at most.
const MAX_LISTED: usize = 2_000;
/// Text of one listing's answers read at most (a page is read whole, then the listing stops):
/// a listing holds its turn for a bounded time whatever the namespace holds.
const MAX_LISTING_TEXT: usize = 32 << 20;

/// What `params` selects of `api`, read page by page for display: all objects of the listing
/// within [`provisioning_controller::decode::LIST_SIZE`] decoded (those past it, and any one
/// over the per-object budget, shown by name only), two listings at a time in the process
/// (the console runs in the controller's), at most [`MAX_LISTED`] objects or
/// [`MAX_LISTING_TEXT`] of answers.
pub async fn bounded_list(api: &Api<BoundedObject>, params: &ListParams) -> Result<Vec<Value>, ListingError> {
    let _turn = turn().await?;
    let mut left = provisioning_controller::decode::LIST_SIZE;
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    let mut read = 0usize;
    loop {
        let mut page = params.clone().limit(PAGE);
        if let Some(t) = token.take() {
            page = page.continue_token(&t);
        }
        let request = kube::core::Request::new(api.resource_url())
            .list(&page)
            .map_err(|e| ListingError::Other(format!("building a list request: {e}")))?;
        let text = api.clone().into_client().request_text(request).await?;
        read += text.len();
        let (got, next) = provisioning_controller::decode::bounded_page(&text, &mut left)
            .map_err(|e| ListingError::Other(format!("reading a list: {e}")))?;
        drop(text);
        items.extend(got);
        match next {
            Some(next) if items.len() < MAX_LISTED && read < MAX_LISTING_TEXT => token = Some(next),
            _ => return Ok(items),
        }
    }
}
