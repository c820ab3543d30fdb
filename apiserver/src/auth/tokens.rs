//! ServiceAccount tokens: ES256-signed JWTs in the shape kube-apiserver issues.
//!
//! The signing key is generated once into the data directory (mode 0600) so tokens survive
//! restarts. Verification checks the signature, issuer, expiry and audience here; whether the
//! ServiceAccount still exists with the token's uid is checked by the caller against storage.

use std::path::Path;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair};
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The issuer and default audience, as a cluster's kube-apiserver uses by default.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Tokens last one hour unless the request asks otherwise (TokenRequest's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// Shortest lifetime a TokenRequest may ask for (kube-apiserver's validation).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;

/// Longest lifetime accepted (2^32 seconds, kube-apiserver's validation).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// The longest lifetime a TokenRequest gets by default (kube-apiserver has no default for
/// `--service-account-max-token-expiration`; managed clusters use 24–48 h): 48 hours. Longer
/// requests are shortened to it, with a warning, as upstream does.
pub const DEFAULT_MAX_EXPIRATION_SECONDS: i64 = 48 * 3600;

/// Why a token was not accepted. Never carries the token itself.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not three base64url parts, or a part is not the JSON expected.
    #[error("token is malformed")]
    Malformed,
    /// Header names another algorithm or key.
    #[error("token uses an unsupported algorithm or key")]
    UnsupportedAlgorithm,
    /// Signature does not verify with the server's key.
    #[error("token signature is invalid")]
    BadSignature,
    /// Issuer is not this server.
    #[error("token issuer is not this server")]
    WrongIssuer,
    /// `exp` is in the past.
    #[error("token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// No audience of the token is accepted by the server.
    #[error("token audiences are not accepted by this server")]
    WrongAudience,
    /// The signing key file could not be read or created.
    #[error("signing key: {0}")]
    Key(String),
}

/// The `kubernetes.io` private claim.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KubernetesClaim {
    /// Namespace of the ServiceAccount.
    pub namespace: String,
    /// The ServiceAccount.
    pub serviceaccount: Ref,
}

/// Name and uid of a referenced object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ref {
    /// metadata.name
    pub name: String,
    /// metadata.uid
    pub uid: String,
}

/// Claims of a ServiceAccount token (the subset kube-apiserver writes for unbound tokens).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// Audiences.
    pub aud: Vec<String>,
    /// Expiry (Unix seconds).
    pub exp: i64,
    /// Issued at.
    pub iat: i64,
    /// Issuer.
    pub iss: String,
    /// Token id, reported as the credential id.
    pub jti: String,
    /// Not before.
    pub nbf: i64,
    /// `system:serviceaccount:NS:NAME`.
    pub sub: String,
    /// Namespace and ServiceAccount.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: String,
}

/// Signs and verifies tokens with one P-256 key.
pub struct Signer {
    key: EcdsaKeyPair,
    kid: String,
    issuer: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key never appears in debug output.
        f.debug_struct("Signer").field("kid", &self.kid).field("issuer", &self.issuer).finish()
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

impl Signer {
    /// A signer over a PKCS#8 P-256 key.
    pub fn from_pkcs8(der: &[u8], issuer: &str) -> Result<Self, TokenError> {
        let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der)
            .map_err(|_| TokenError::Key("not a PKCS#8 P-256 key".into()))?;
        // kube-apiserver's key id: base64url(sha256(public key)); it lets verifiers pick keys.
        let kid = b64(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.public_key().as_ref()).as_ref());
        Ok(Signer { key, kid, issuer: issuer.to_string() })
    }

    /// A fresh key (tests and first start).
    pub fn generate(issuer: &str) -> Result<(Self, Vec<u8>), TokenError> {
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
            .map_err(|_| TokenError::Key("generating a P-256 key failed".into()))?;
        let der = doc.as_ref().to_vec();
        Ok((Self::from_pkcs8(&der, issuer)?, der))
    }

    /// Loads `dir/sa.key`, creating it (mode 0600) on first use.
    pub fn load_or_create(dir: &Path, issuer: &str) -> Result<Self, TokenError> {
        let path = dir.join("sa.key");
        match std::fs::read(&path) {
            Ok(der) => Self::from_pkcs8(&der, issuer).map_err(|e| TokenError::Key(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (signer, der) = Self::generate(issuer)?;
                crate::tls::write_private(&path, &der).map_err(|e| TokenError::Key(format!("{}: {e:#}", path.display())))?;
                Ok(signer)
            }
            Err(e) => Err(TokenError::Key(format!("{}: {e}", path.display()))),
        }
    }

    /// The public key as a JSON Web Key Set (`/openid/v1/jwks`), so other verifiers (a
    /// workload identity broker, Vault) can check tokens as they do against a cluster.
    pub fn jwks(&self) -> serde_json::Value {
        // An uncompressed P-256 point: 0x04 || x (32 bytes) || y (32 bytes).
        let point = self.key.public_key().as_ref();
        let (x, y) = if point.len() == 65 { (b64(&point[1..33]), b64(&point[33..])) } else { (String::new(), String::new()) };
        serde_json::json!({"keys": [{"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256", "x": x, "y": y}]})
    }

    /// The OpenID provider configuration (`/.well-known/openid-configuration`).
    pub fn openid_configuration(&self) -> serde_json::Value {
        serde_json::json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// The issuer written into and required of tokens.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Signs `claims` into a compact JWT.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        let header = serde_json::to_vec(&Header { alg: "ES256".into(), kid: self.kid.clone() }).map_err(|_| TokenError::Malformed)?;
        let payload = serde_json::to_vec(claims).map_err(|_| TokenError::Malformed)?;
        let input = format!("{}.{}", b64(&header), b64(&payload));
        let sig = self.key.sign(&SystemRandom::new(), input.as_bytes()).map_err(|_| TokenError::Key("signing failed".into()))?;
        Ok(format!("{input}.{}", b64(sig.as_ref())))
    }

    /// Whether `token` looks like a JWT at all (three dot-separated parts); cheap pre-check.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3
    }

    /// Verifies signature, issuer, time window (at `now`, Unix seconds) and that one of the
    /// token's audiences is in `accepted`.
    pub fn verify(&self, token: &str, accepted: &[String], now: i64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Malformed);
        };
        let dec = |x: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(x).map_err(|_| TokenError::Malformed);
        let header: Header = serde_json::from_slice(&dec(h)?).map_err(|_| TokenError::Malformed)?;
        if header.alg != "ES256" || (!header.kid.is_empty() && header.kid != self.kid) {
            return Err(TokenError::UnsupportedAlgorithm);
        }
        let sig = dec(s)?;
        let public = signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, self.key.public_key().as_ref());
        let signed_len = h.len() + 1 + p.len();
        public.verify(&token.as_bytes()[..signed_len], &sig).map_err(|_| TokenError::BadSignature)?;
        let claims: Claims = serde_json::from_slice(&dec(p)?).map_err(|_| TokenError::Malformed)?;
        if claims.iss != self.issuer {
            return Err(TokenError::WrongIssuer);
        }
        if now >= claims.exp {
            return Err(TokenError::Expired);
        }
        // Same small clock-skew allowance as upstream's validator for nbf.
        if claims.nbf > now + 60 {
            return Err(TokenError::NotYetValid);
        }
        if !claims.aud.iter().any(|a| accepted.contains(a)) {
            return Err(TokenError::WrongAudience);
        }
        Ok(claims)
    }

    /// Claims for a new token for ServiceAccount `ns/name` (uid `uid`).
    pub fn claims(&self, ns: &str, name: &str, uid: &str, audiences: Vec<String>, now: i64, expiration_seconds: i64) -> Claims {
        Claims {
            aud: audiences,
            exp: now + expiration_seconds,
            iat: now,
            iss: self.issuer.clone(),
            jti: uuid::Uuid::new_v4().to_string(),
            nbf: now,
            sub: format!("system:serviceaccount:{ns}:{name}"),
            kubernetes: KubernetesClaim { namespace: ns.to_string(), serviceaccount: Ref { name: name.to_string(), uid: uid.to_string() } },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aud() -> Vec<String> {
        vec![DEFAULT_ISSUER.to_string()]
    }

    #[test]
    fn sign_then_verify_round_trips() -> Result<(), TokenError> {
        let (s, _) = Signer::generate(DEFAULT_ISSUER)?;
        let c = s.claims("demo", "ci", "u-1", aud(), 1_000, 3600);
        let t = s.sign(&c)?;
        assert_eq!(s.verify(&t, &aud(), 1_001)?, c);
        assert_eq!(c.sub, "system:serviceaccount:demo:ci");
        Ok(())
    }

    #[test]
    fn rejects_expired_wrong_audience_tampered_and_foreign_keys() -> Result<(), TokenError> {
        let (s, der) = Signer::generate(DEFAULT_ISSUER)?;
        let t = s.sign(&s.claims("demo", "ci", "u-1", aud(), 1_000, 600))?;
        assert_eq!(s.verify(&t, &aud(), 1_600), Err(TokenError::Expired));
        assert_eq!(s.verify(&t, &["https://other".to_string()], 1_001), Err(TokenError::WrongAudience));
        let other = s.sign(&s.claims("demo", "ci", "u-1", vec!["vault".into()], 1_000, 600))?;
        assert_eq!(s.verify(&other, &aud(), 1_001), Err(TokenError::WrongAudience));
        // Changing the payload breaks the signature.
        let parts: Vec<&str> = t.split('.').collect();
        let forged_claims = s.claims("kube-system", "admin", "u-2", aud(), 1_000, 600);
        let forged = format!("{}.{}.{}", parts[0], b64(&serde_json::to_vec(&forged_claims).map_err(|_| TokenError::Malformed)?), parts[2]);
        assert_eq!(s.verify(&forged, &aud(), 1_001), Err(TokenError::BadSignature));
        // Another server's key: kid differs.
        let (s2, _) = Signer::generate(DEFAULT_ISSUER)?;
        assert_eq!(s2.verify(&t, &aud(), 1_001), Err(TokenError::UnsupportedAlgorithm));
        // The same key reloaded verifies.
        let s3 = Signer::from_pkcs8(&der, DEFAULT_ISSUER)?;
        assert!(s3.verify(&t, &aud(), 1_001).is_ok());
        for bad in ["", "a.b", "a.b.c", "....", "eyJhbGciOiJub25lIn0.e30."] {
            assert!(s.verify(bad, &aud(), 1_001).is_err(), "{bad:?} accepted");
        }
        Ok(())
    }

    #[test]
    fn jwks_publishes_the_verifying_key() -> Result<(), TokenError> {
        let (s, _) = Signer::generate(DEFAULT_ISSUER)?;
        let jwks = s.jwks();
        let k = &jwks["keys"][0];
        assert_eq!((k["kty"].as_str(), k["crv"].as_str(), k["kid"].as_str()), (Some("EC"), Some("P-256"), Some(s.kid.as_str())));
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(k["x"].as_str().unwrap_or_default())
            .map_err(|_| TokenError::Malformed)?;
        let y = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(k["y"].as_str().unwrap_or_default())
            .map_err(|_| TokenError::Malformed)?;
        let point = [vec![4u8], x, y].concat();
        // The published coordinates verify a token signed by the key.
        let t = s.sign(&s.claims("demo", "ci", "u-1", aud(), 1_000, 600))?;
        let (input, sig) = t.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig).map_err(|_| TokenError::Malformed)?;
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &point)
            .verify(input.as_bytes(), &sig)
            .map_err(|_| TokenError::BadSignature)?;
        assert_eq!(s.openid_configuration()["jwks_uri"], format!("{DEFAULT_ISSUER}/openid/v1/jwks"));
        Ok(())
    }

    #[test]
    fn alg_none_is_refused() -> Result<(), TokenError> {
        let (s, _) = Signer::generate(DEFAULT_ISSUER)?;
        let c = s.claims("demo", "ci", "u-1", aud(), 1_000, 600);
        let t = format!("{}.{}.", b64(br#"{"alg":"none"}"#), b64(&serde_json::to_vec(&c).map_err(|_| TokenError::Malformed)?));
        assert_eq!(s.verify(&t, &aud(), 1_001), Err(TokenError::UnsupportedAlgorithm));
        Ok(())
    }
}
