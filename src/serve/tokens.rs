//! Token files a running server follows (SIGHUP and every few seconds), so a token is
//! rotated without a restart: join tokens, gRPC tokens, the API token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_aggregator::Registry;
use flotilla_proto::dial::Dialer;

use crate::secrets::DataDir;

/// How often the join-token file is read again (SIGHUP reads it at once).
const TOKEN_RELOAD: Duration = Duration::from_secs(10);

/// Makes a new token list the accepted one.
pub type ApplyTokens = Box<dyn Fn(&[String]) + Send>;

/// A token-list file that a running process follows: shards accept its tokens, callers
/// send the first.
pub struct TokenFile {
    /// `join`, `grpc` or `api`, for the logs.
    pub name: &'static str,
    /// How many tokens are accepted now (shards' `flotilla_NAME_tokens`; none for a
    /// caller), and the reads of the file (`flotilla_NAME_token(s)_reloaded_total{result}`).
    pub metrics: (Option<flotilla_obs::Family>, flotilla_obs::Family),
    pub path: PathBuf,
    /// What is accepted now.
    pub current: Vec<String>,
    pub apply: ApplyTokens,
}

/// The join tokens of `registries` (and of the artifact tracker, which checks agents'
/// proofs of them), followed in DATA/join-token.
pub fn join_token_file(
    data: &DataDir,
    registries: Vec<Arc<Registry>>,
    origin: Option<Arc<flotilla_control::artifacts::Origin>>,
) -> TokenFile {
    if let Some(o) = &origin {
        o.set_join_tokens(&data.join_tokens);
    }
    TokenFile {
        name: "join",
        metrics: (Some(crate::catalogue::JOIN_TOKENS), crate::catalogue::JOIN_TOKENS_RELOADED),
        path: data.dir.join("join-token"),
        current: data.join_tokens.clone(),
        apply: Box::new(move |t| {
            registries.iter().for_each(|r| r.set_join_tokens(t.to_vec()));
            if let Some(o) = &origin {
                o.set_join_tokens(t);
            }
        }),
    }
}

/// A control plane's copy of the join tokens (`--join-token-file`): the tracker takes
/// announces from agents that prove they hold one.
pub fn tracker_token_file(
    path: PathBuf,
    current: Vec<String>,
    origin: Arc<flotilla_control::artifacts::Origin>,
) -> TokenFile {
    origin.set_join_tokens(&current);
    TokenFile {
        name: "join",
        metrics: (None, crate::catalogue::JOIN_TOKENS_RELOADED),
        path,
        current,
        apply: Box::new(move |t| origin.set_join_tokens(t)),
    }
}

/// The gRPC tokens of `auths` (the shards' token checks), followed in DATA/grpc-token;
/// `callers` (the dialers of schedulers and a control plane in the same process) send
/// the first.
pub fn grpc_token_file(data: &DataDir, auths: Vec<flotilla_aggregator::GrpcAuth>, callers: Vec<Dialer>) -> TokenFile {
    TokenFile {
        name: "grpc",
        metrics: (Some(crate::catalogue::GRPC_TOKENS), crate::catalogue::GRPC_TOKENS_RELOADED),
        path: data.dir.join("grpc-token"),
        current: data.grpc_tokens.clone(),
        apply: Box::new(move |t| {
            auths.iter().for_each(|a| a.set_tokens(t.to_vec()));
            callers.iter().for_each(|d| send_first(d, t));
        }),
    }
}

/// A caller's gRPC token file (`--grpc-token-file`, else DATA/grpc-token): its calls carry
/// the first token. Put the new token first in every shard's file and in this one, then
/// retire the old: calls never carry a token no shard accepts.
pub fn grpc_caller_token_file(path: PathBuf, current: Vec<String>, dialer: Dialer) -> TokenFile {
    TokenFile {
        name: "grpc",
        metrics: (None, crate::catalogue::GRPC_TOKENS_RELOADED),
        path,
        current,
        apply: Box::new(move |t| send_first(&dialer, t)),
    }
}

fn send_first(dialer: &Dialer, tokens: &[String]) {
    if let Some(first) = tokens.first()
        && let Err(e) = dialer.set_token(first)
    {
        tracing::error!(error = %e, "keeping the gRPC token sent now");
    }
}

/// The API token of a control plane or scheduler (mutating calls need it), followed in
/// `path`: its first line is the token.
pub fn api_token_file(path: PathBuf, token: flotilla_core::SharedToken) -> TokenFile {
    TokenFile {
        name: "api",
        metrics: (None, crate::catalogue::API_TOKEN_RELOADED),
        path,
        current: token.get().map(|t| t.to_string()).into_iter().collect(),
        apply: Box::new(move |t| token.set(t.first().cloned())),
    }
}

/// Runs `read` on SIGHUP and every [`TOKEN_RELOAD`] (in a span naming `file` and why),
/// counting each outcome it returns in `reloads{result}`. The handler is installed before
/// this returns, so a SIGHUP from then on never kills the process.
fn follow(
    file: String,
    reloads: flotilla_obs::Family,
    mut read: impl FnMut() -> &'static str + Send + 'static,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TOKEN_RELOAD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let why = tokio::select! {
                _ = tick.tick() => "timer",
                _ = hup.recv() => "SIGHUP",
            };
            let _span = tracing::info_span!("tokens_reload", %file, why).entered();
            let result = read();
            metrics::counter!(reloads.name, "result" => result).increment(1);
        }
    });
    Ok(())
}

/// Follows the named tokens' file (`flotilla token create` writes it; operators may edit
/// it). A file that does not load changes nothing (logged and counted): the tokens in
/// force stay.
pub fn follow_token_book(tokens: Arc<flotilla_control::tokens::Tokens>) -> anyhow::Result<()> {
    use flotilla_control::catalogue as cm;
    let count = |t: &flotilla_control::tokens::Tokens| t.book().grants().len() as f64;
    metrics::gauge!(cm::TOKENS.name).set(count(&tokens));
    let file = tokens.file().map(|p| p.display().to_string()).unwrap_or_default();
    follow(file, cm::TOKENS_RELOADED, move || {
        let result = match tokens.reload() {
            Ok(true) => {
                tracing::info!(tokens = count(&tokens), "named API tokens reloaded");
                "ok"
            }
            Ok(false) => "unchanged",
            Err(e) => {
                tracing::error!(error = %e, "the tokens file does not load: keeping the tokens in force");
                "error"
            }
        };
        metrics::gauge!(cm::TOKENS.name).set(count(&tokens));
        result
    })
}

/// Reads the file again on SIGHUP and every 10 s, and applies the tokens when they
/// changed. A file that cannot be read, or holds no token, changes nothing (it is logged
/// and counted).
pub fn reload_tokens(file: TokenFile) -> anyhow::Result<()> {
    let TokenFile { name, path, mut current, apply, metrics: (gauge, reloads) } = file;
    let accepted = move |n: usize| {
        if let Some(g) = gauge {
            metrics::gauge!(g.name).set(n as f64);
        }
    };
    accepted(current.len());
    let shown = path.display().to_string();
    follow(shown, reloads, move || match crate::secrets::read_tokens(&path) {
        Ok(tokens) if tokens.is_empty() => {
            tracing::error!(kept = current.len(), "the file holds no token: keeping the ones accepted now");
            "error"
        }
        Ok(tokens) if tokens == current => "unchanged",
        Ok(tokens) => {
            apply(&tokens);
            tracing::info!(before = current.len(), now = tokens.len(), "{name} tokens reloaded");
            accepted(tokens.len());
            current = tokens;
            "changed"
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), kept = current.len(), "cannot read the tokens: keeping the ones accepted now");
            "error"
        }
    })
}
