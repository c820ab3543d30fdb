//! Following the engine's container events: a container of ours that dies (stopped, killed,
//! crashed) or is destroyed becomes a [`MachineEvent`], within moments of it happening.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{EventMessage, EventMessageTypeEnum};
use bollard::query_parameters::EventsOptions;
use futures::TryStreamExt;

use super::docker::{classify, connect};
use crate::{MachineEvent, MachineEventKind, MachineEvents, ProviderId, tags};

/// The engine's events for containers carrying a server uid label that stop or go away.
pub(crate) fn follow(endpoint: String) -> MachineEvents {
    let filters = HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        ("label".to_string(), vec![tags::SERVER_UID.to_string()]),
        ("event".to_string(), vec!["die".to_string(), "stop".to_string(), "destroy".to_string()]),
    ]);
    let stream = futures::stream::once(async move { connect(&endpoint).await })
        .map_ok(move |docker| {
            docker
                .events(Some(EventsOptions { filters: Some(filters.clone()), ..Default::default() }))
                .map_err(|e| classify("follow container events", e))
                .try_filter_map(|message| futures::future::ready(Ok(machine_event(&message))))
        })
        .try_flatten();
    Box::pin(stream)
}

/// The machine event of an engine event, when it is one about a machine of ours.
fn machine_event(message: &EventMessage) -> Option<MachineEvent> {
    if message.typ != Some(EventMessageTypeEnum::CONTAINER) {
        return None;
    }
    let kind = match message.action.as_deref()? {
        "die" | "stop" => MachineEventKind::Stopped,
        "destroy" => MachineEventKind::Removed,
        _ => return None,
    };
    let actor = message.actor.as_ref()?;
    let id = actor.id.as_deref().filter(|id| !id.is_empty())?;
    let attributes = actor.attributes.clone().unwrap_or_default();
    // Only our identity labels travel on (the attributes also hold image and name).
    let tags: BTreeMap<String, String> = attributes.into_iter().filter(|(k, _)| k.starts_with("provisioning.dev/")).collect();
    tags.contains_key(tags::SERVER_UID).then(|| MachineEvent { provider_id: ProviderId::new("local", id), kind, tags })
}

#[cfg(test)]
mod tests {
    use bollard::models::EventActor;

    use super::*;

    fn message(action: &str, labels: &[(&str, &str)]) -> EventMessage {
        let mut attributes: HashMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        attributes.insert("image".into(), "provisioning-node:latest".into());
        EventMessage {
            typ: Some(EventMessageTypeEnum::CONTAINER),
            action: Some(action.into()),
            actor: Some(EventActor { id: Some("abc123".into()), attributes: Some(attributes) }),
            ..Default::default()
        }
    }

    #[test]
    fn deaths_and_removals_of_our_containers_become_machine_events() {
        let ours = [(tags::SERVER_UID, "u1"), (tags::NAMESPACE, "default"), (tags::SERVER, "web")];
        let died = machine_event(&message("die", &ours)).expect("a machine event");
        assert_eq!(died.kind, MachineEventKind::Stopped);
        assert_eq!(died.provider_id, ProviderId::new("local", "abc123"));
        assert_eq!(died.tags.get(tags::SERVER).map(String::as_str), Some("web"));
        assert!(!died.tags.contains_key("image"), "only identity labels: {:?}", died.tags);
        assert_eq!(machine_event(&message("destroy", &ours)).map(|e| e.kind), Some(MachineEventKind::Removed));
        // Other actions, containers without a server uid, and other object types are not ours.
        assert_eq!(machine_event(&message("start", &ours)), None);
        assert_eq!(machine_event(&message("die", &[(tags::NAMESPACE, "default")])), None);
        let network = EventMessage { typ: Some(EventMessageTypeEnum::NETWORK), ..message("destroy", &ours) };
        assert_eq!(machine_event(&network), None);
    }
}
