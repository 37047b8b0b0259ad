//! `flotilla token create|list|revoke`: named API tokens with scopes (admin only).

use clap::{Args, Subcommand};

use super::http::{Body, WriteArgs, print_json, token};
use super::table::Table;

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub action: TokenAction,
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Make a named token; it is printed once, alone on the last line of stdout (the
    /// control plane keeps only its hash).
    Create {
        /// Recorded with every change the token makes (`history`, logs).
        name: String,
        /// read (every GET), operate (scale, drain, cordon, demand, rollback), deploy
        /// (apply, plan, policies), admin (tokens, registrations, everything).
        #[arg(long = "scope", value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// Limit the token to these apps (it may then change nothing that belongs to no
        /// app: nodes, pools, policies).
        #[arg(long, value_delimiter = ',')]
        apps: Option<Vec<String>>,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// The named tokens, their scopes and apps (never the tokens).
    List {
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Refuse a named token from now on.
    Revoke {
        name: String,
        #[command(flatten)]
        write: WriteArgs,
    },
}

pub async fn token_command(a: TokenArgs) -> anyhow::Result<()> {
    match a.action {
        TokenAction::Create { name, scopes, apps, write } => {
            let body = serde_json::json!({"name": name, "scopes": scopes, "apps": apps});
            let answer = send(&write, reqwest::Method::POST, "/v1/tokens", Some(Body::Json(body))).await?;
            if write.json {
                return print_json(&answer);
            }
            let apps = answer["apps"].as_array().map_or("every app".to_string(), |a| {
                a.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            });
            let scopes: Vec<&str> =
                answer["scopes"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
            println!("token {name}: {} on {apps}; shown once, keep it now:", scopes.join(", "));
            println!("{}", answer["token"].as_str().unwrap_or_default());
        }
        TokenAction::List { write } => {
            let answer = send(&write, reqwest::Method::GET, "/v1/tokens", None).await?;
            if write.json {
                return print_json(&answer);
            }
            let mut t = Table::new(&["NAME", "SCOPES", "APPS"]);
            let list = |v: &serde_json::Value| -> String {
                v.as_array().map_or("*".into(), |a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(","))
            };
            for r in answer["tokens"].as_array().cloned().unwrap_or_default() {
                t.row(vec![r["name"].as_str().unwrap_or("-").to_string(), list(&r["scopes"]), list(&r["apps"])]);
            }
            t.print();
        }
        TokenAction::Revoke { name, write } => {
            let answer = send(&write, reqwest::Method::DELETE, &format!("/v1/tokens/{name}"), None).await?;
            if write.json {
                return print_json(&answer);
            }
            println!("token {name} revoked");
        }
    }
    Ok(())
}

async fn send(
    write: &WriteArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<Body>,
) -> anyhow::Result<serde_json::Value> {
    write.api()?.write(method, path, &token(write.token.clone())?, body).await
}
