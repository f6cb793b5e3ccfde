//! The `parsim` binary: parses the command line, runs it, and turns errors into a message
//! with its cause chain and a nonzero exit code.

mod cli;

use clap::Parser;

fn main() {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`| head`).
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let parsed = cli::Cli::parse();
    if let Err(err) = cli::run(parsed) {
        eprintln!("error: {err}");
        for cause in err.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}
