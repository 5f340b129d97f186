//! The `idemgate` command line: `run` (the default), `check-config`, `demo`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// mimalloc: fewer cycles per delivery than glibc malloc in the load benchmark (see
/// BENCHMARKS.md), with a small resident footprint.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "idemgate", version, about = "Webhook de-duplication sidecar")]
struct Cli {
    /// The configuration file (TOML). Without one, idemgate runs on its defaults.
    #[arg(long, global = true, env = "IDEMGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar (the default).
    Run,
    /// Validate the configuration and print it with secrets redacted (`--running`: the
    /// running sidecar's configuration in force, and since when).
    CheckConfig {
        #[arg(long)]
        running: bool,
        #[command(flatten)]
        admin: idemgate::ReloadArgs,
    },
    /// A self-contained tour on the in-memory store.
    Demo,
    /// Add the idemgate sidecar to Kubernetes YAML (file or stdin) and print it.
    Inject(idemgate::InjectArgs),
    /// The Kubernetes admission webhook: injects the sidecar into pods as they are
    /// created (POST /mutate over HTTPS), as `inject` would.
    Injector(idemgate::InjectorArgs),
    /// Operator tools on the delivery log (Redis): list, show, forget, replay.
    Deliveries(idemgate::DeliveriesArgs),
    /// Async routes as a whole (Redis): list, pause, resume.
    Routes(idemgate::RoutesArgs),
    /// Operators' bulk jobs (Redis): start a redrive or replay, show, list.
    Jobs(idemgate::JobsArgs),
    /// Ask the running sidecar to reload its configuration (POST /admin/reload).
    Reload(idemgate::ReloadArgs),
}

/// Sets up logging to stderr. Lines are formatted on the caller's thread and written in
/// batches by a background thread (`idemgate::logging`), so a delivery never waits on a
/// `write(2)` nor wakes a thread per line; the returned guard writes what is left when
/// it drops, at exit.
fn init_logging(default: &str) -> Result<idemgate::logging::Guard, String> {
    let filter = std::env::var("IDEMGATE_LOG")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string());
    let filter = EnvFilter::try_new(&filter).map_err(|e| format!("IDEMGATE_LOG: {e}"))?;
    let (writer, guard) = idemgate::logging::batched(std::io::stderr());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    // The filter sits behind a reload handle: the configuration's `log` and a live
    // reload set it (`idemgate::logging::set_level`).
    macro_rules! init_reloadable {
        ($builder:expr) => {{
            let builder = $builder.with_filter_reloading();
            let handle = builder.reload_handle();
            idemgate::logging::install_level_control(Box::new(move |filter: &str| {
                let filter = EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
                handle.reload(filter).map_err(|e| e.to_string())
            }));
            builder.init()
        }};
    }
    match std::env::var("IDEMGATE_LOG_FORMAT").as_deref() {
        Ok("json") => init_reloadable!(builder.json().flatten_event(true)),
        Ok("text") | Err(_) => init_reloadable!(builder),
        Ok(other) => {
            return Err(format!(
                "IDEMGATE_LOG_FORMAT: `{other}` is not json or text"
            ));
        }
    }
    Ok(guard)
}

/// A tokio runtime: the `current_thread` scheduler for one thread, the multi-thread
/// scheduler otherwise. The sidecar runs on one `current_thread` runtime, and
/// `server::run` starts a thread with a runtime of its own per further `worker_threads`.
fn runtime(worker_threads: usize) -> tokio::runtime::Runtime {
    let mut builder = if worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(worker_threads);
        b
    };
    builder.enable_all().build().expect("tokio runtime")
}

/// Opts the process out of transparent huge pages before anything is allocated.
/// mimalloc advises its arena for huge pages (`MADV_HUGEPAGE`), and where THP is
/// `madvise` or `always` each 2 MiB region it touches is resident whole: 6 of the
/// 14.5 MiB idle RSS were three huge pages (BENCHMARKS.md). Calling this from `main` is
/// too late for the regions the runtime's first allocations touch (4 MiB stayed), so it
/// runs as an ELF constructor, before Rust's runtime starts. A kernel without the
/// option returns an error, which is harmless.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static NO_TRANSPARENT_HUGE_PAGES: extern "C" fn() = {
    extern "C" fn no_thp() {
        // SAFETY: prctl with PR_SET_THP_DISABLE takes integer arguments only and
        // touches no memory of ours.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
    no_thp
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Inject(args) => idemgate::inject_main(args),
        Command::Injector(args) => {
            let _log_guard = match init_logging("info") {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            };
            let shutdown = idemgate::server::shutdown_signal();
            match runtime(2).block_on(idemgate::run_injector(args, shutdown)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("idemgate injector: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Deliveries(args) => {
            // Admin actions are logged (target idemgate::audit) to stderr.
            let _log_guard = init_logging("warn,idemgate::audit=info").ok();
            idemgate::deliveries_main(cli.config.as_deref(), args)
        }
        Command::Routes(args) => {
            let _log_guard = init_logging("warn,idemgate::audit=info").ok();
            idemgate::routes_main(cli.config.as_deref(), args)
        }
        Command::Jobs(args) => {
            let _log_guard = init_logging("warn,idemgate::audit=info").ok();
            idemgate::jobs_main(cli.config.as_deref(), args)
        }
        Command::Reload(args) => idemgate::reload_main(cli.config.as_deref(), args),
        Command::CheckConfig {
            running: true,
            admin,
        } => idemgate::show_running_config(cli.config.as_deref(), admin),
        Command::CheckConfig { .. } => match idemgate::providers::load(cli.config.as_deref()) {
            Ok((config, _routes)) => {
                // A `file:` store's directory must be creatable, writable and free.
                if let idemgate::config::StoreUrl::File(dir) = &config.store.url
                    && let Err(e) = idemgate::store::file::check_dir(dir)
                {
                    eprintln!("invalid configuration: store.url: {e}");
                    return ExitCode::from(1);
                }
                print!("{}", config.redacted_toml());
                if let Some(w) = config.memory_store_warning() {
                    eprintln!("note: {w}");
                }
                for short in idemgate::providers::short_hmac_secrets(&config) {
                    eprintln!("warning: {short}");
                }
                eprintln!("configuration is valid");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("invalid configuration: {e}");
                ExitCode::from(1)
            }
        },
        Command::Demo => {
            let _log_guard = match init_logging("warn") {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            };
            match runtime(1).block_on(idemgate::run_demo()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Run => {
            let _log_guard = match init_logging("info") {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            };
            let (config, routes) = match idemgate::providers::load(cli.config.as_deref()) {
                Ok(loaded) => loaded,
                Err(e) => {
                    tracing::error!("invalid configuration: {e}");
                    eprintln!("invalid configuration: {e}");
                    return ExitCode::from(1);
                }
            };
            // The configuration's `log` (`IDEMGATE_LOG` over it), validated with it.
            if let Err(e) = idemgate::logging::set_level(&config.log.filter) {
                tracing::error!("invalid configuration: {}: {e}", config.log.field);
                return ExitCode::from(1);
            }
            if let Some(w) = config.memory_store_warning() {
                tracing::warn!("{w}");
            }
            for short in idemgate::providers::short_hmac_secrets(&config) {
                tracing::warn!("{short}");
            }
            if config.routes.is_empty() {
                tracing::warn!("no routes configured: every delivery will be answered 404");
            }
            let result = runtime(1).block_on(idemgate::server::run(
                config,
                routes,
                idemgate::server::shutdown_signal(),
            ));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("idemgate: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
