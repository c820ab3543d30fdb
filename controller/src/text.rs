//! Wording shared by messages a person reads (conditions, events, errors): counts with the
//! noun in the right number ("1 server", "2 servers"), and object names under their kind
//! ("Server a", "Servers a, b").

/// `n` and `noun`, plural unless `n` is 1: "1 server", "0 servers", "3 TaskServs".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// `kind` and the names after it, plural for more than one: "Server a", "Servers a, b".
pub fn named(kind: &str, names: &[String]) -> String {
    if names.len() == 1 { format!("{kind} {}", names[0]) } else { format!("{kind}s {}", names.join(", ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_names_take_the_number_of_their_noun() {
        let cases = [(0, "0 servers"), (1, "1 server"), (2, "2 servers")];
        for (n, want) in cases {
            assert_eq!(count(n, "server"), want);
        }
        assert_eq!(count(1, "TaskServ"), "1 TaskServ");
        assert_eq!(named("Server", &["a".into()]), "Server a");
        assert_eq!(named("Server", &["a".into(), "b".into()]), "Servers a, b");
    }
}
