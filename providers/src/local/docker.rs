//! Connecting to the Docker engine and classifying its errors.

use bollard::Docker;
use bollard::errors::Error as DockerError;

use crate::ProviderError;

/// What to tell a user whose Docker engine does not answer.
pub(crate) const START_DOCKER_HINT: &str = "is the Docker engine running? scripts/setup.sh starts one";

/// Connects to the engine at `endpoint` (empty: `DOCKER_HOST` or the local socket) and
/// negotiates the API version, so that older engines (Debian's docker.io) accept our calls.
pub async fn connect(endpoint: &str) -> Result<Docker, ProviderError> {
    let unreachable = |e: DockerError| {
        let shown = if endpoint.is_empty() { "the local Docker socket" } else { endpoint };
        ProviderError::Transient(format!("cannot reach the Docker engine at {shown} ({e}); {START_DOCKER_HINT}"))
    };
    let docker = if endpoint.is_empty() {
        Docker::connect_with_local_defaults()
    } else if endpoint.starts_with("unix://") || endpoint.starts_with('/') {
        Docker::connect_with_socket(endpoint, 120, bollard::API_DEFAULT_VERSION)
    } else if endpoint.starts_with("tcp://") || endpoint.starts_with("http://") {
        Docker::connect_with_http(endpoint, 120, bollard::API_DEFAULT_VERSION)
    } else {
        return Err(ProviderError::InvalidRequest(format!(
            "Docker endpoint {endpoint:?} is neither a unix socket (unix:///path) nor tcp://host:port"
        )));
    }
    .map_err(unreachable)?;
    docker.negotiate_version().await.map_err(unreachable)
}

/// The HTTP status of an engine error response, if it was one.
pub(crate) fn status_of(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Classifies an engine error for retry: 404 → NotFound, 400 → InvalidRequest, other 4xx →
/// Permanent, 5xx and transport failures → Transient.
pub(crate) fn classify(step: &str, e: DockerError) -> ProviderError {
    match &e {
        DockerError::DockerResponseServerError { status_code, message } => match status_code {
            404 => ProviderError::NotFound(format!("{step}: {message}")),
            400 => ProviderError::InvalidRequest(format!("{step}: {message}")),
            401 | 403 => ProviderError::Auth(format!("{step}: {message}")),
            409 | 500..=599 => ProviderError::Transient(format!("{step}: {message}")),
            _ => ProviderError::Permanent(format!("{step}: {message}")),
        },
        DockerError::DockerStreamError { error } => ProviderError::Permanent(format!("{step}: {error}")),
        DockerError::JsonDataError { .. } | DockerError::JsonSerdeError { .. } => {
            ProviderError::Permanent(format!("{step}: unexpected answer from the Docker engine: {e}"))
        }
        _ => ProviderError::Transient(format!("{step}: {e}; {START_DOCKER_HINT}")),
    }
}
