//! argocd
