
use builtin;
use str;

set edit:completion:arg-completer[dlock] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'dlock'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'dlock'= {
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Run COMMAND while holding the lock KEY'
            cand acquire 'Take the lock KEY and keep it in the background until `dlock release`'
            cand release 'Give back a lock taken with `dlock acquire`; say whether it was held throughout'
            cand status 'Show who holds KEY, since when, and who waits'
            cand log 'Show the last runs under KEY: where, when, how long, how they ended'
            cand break 'Stop the holder of KEY and free the lock once it has stopped'
            cand bench 'Measure the backend: lock latency, hand-off latency and throughput'
            cand doctor 'Check the server and what stands between: can a lock there be sound?'
            cand prune 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)'
            cand check 'A monitoring plugin: did KEY''s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)'
            cand metrics 'Print the last runs and the locks as Prometheus metrics (for node_exporter''s textfile collector)'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'dlock;run'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)'
            cand --key 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)'
            cand -l 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N'
            cand --limit 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N'
            cand --ttl 'Lease length on the server; renewed every ttl/3'
            cand -w 'Give up after waiting this long for the lock [default: wait forever]'
            cand --wait 'Give up after waiting this long for the lock [default: wait forever]'
            cand -E 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)'
            cand --conflict-exit-code 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)'
            cand --kill-grace 'After SIGTERM to the command (and what it started), how long before SIGKILL'
            cand --reason 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy'
            cand --once-per 'Skip (exit 75, or -E''s code) when a run of KEY started less than DURATION ago on any host, by the backend''s clock; for cron on several hosts'
            cand -s 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
            cand --shared 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
            cand -n 'Try once; do not wait'
            cand --no-wait 'Try once; do not wait'
            cand --no-history 'Leave no record of this run in KEY''s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;acquire'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)'
            cand --key 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)'
            cand -l 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N'
            cand --limit 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N'
            cand --ttl 'Lease length on the server; renewed every ttl/3'
            cand -w 'Give up after waiting this long for the lock [default: wait forever]'
            cand --wait 'Give up after waiting this long for the lock [default: wait forever]'
            cand -E 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)'
            cand --conflict-exit-code 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)'
            cand --kill-grace 'After SIGTERM to the command (and what it started), how long before SIGKILL'
            cand --reason 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy'
            cand --once-per 'Skip (exit 75, or -E''s code) when a run of KEY started less than DURATION ago on any host, by the backend''s clock; for cron on several hosts'
            cand -f 'How to print the handle and the DLOCK_* variables'
            cand --format 'How to print the handle and the DLOCK_* variables'
            cand --owner 'The process the lock is held for: released when it exits, its process group stopped (SIGTERM, SIGKILL after --kill-grace) if the lock is lost; `none` for nobody (needs --max-hold) [default: the process that runs dlock acquire]'
            cand --max-hold 'Give the lock up after holding it this long (stopping the owner first)'
            cand -s 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
            cand --shared 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
            cand -n 'Try once; do not wait'
            cand --no-wait 'Try once; do not wait'
            cand --no-history 'Leave no record of this run in KEY''s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;release'= {
            cand --handle 'What `dlock acquire` printed as DLOCK_HANDLE'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;status'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The lock''s name; without it, every lock held or waited for on the backend, one line each'
            cand --key 'The lock''s name; without it, every lock held or waited for on the backend, one line each'
            cand --json 'Print one JSON object (key, backend, held, holders, ...); without --key, an array of them'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;log'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The lock''s name'
            cand --key 'The lock''s name'
            cand -r 'How many runs to show, newest first'
            cand --runs 'How many runs to show, newest first'
            cand -n 'The old spelling of --runs: taken, with a warning, until a later release drops it (-n is --no-wait in run and acquire)'
            cand --json 'Print a JSON array of runs instead of text'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;break'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The lock''s name'
            cand --key 'The lock''s name'
            cand -w 'Wait until the broken holder has stopped and let go (at most DURATION when given)'
            cand --wait 'Wait until the broken holder has stopped and let go (at most DURATION when given)'
            cand --force 'Remove the lock now, without waiting for its holder to stop: UNSAFE, the next holder may start while the broken command still runs'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;bench'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -c 'Contending clients (threads, each with its own connection) in the hand-off phase'
            cand --clients 'Contending clients (threads, each with its own connection) in the hand-off phase'
            cand -d 'How long each phase runs [default: 3s]'
            cand --duration 'How long each phase runs [default: 3s]'
            cand -o 'Acquisitions per phase, instead of a duration'
            cand --ops 'Acquisitions per phase, instead of a duration'
            cand --ttl 'Lease length of the benchmark''s locks'
            cand --json 'Print one JSON object instead of the table'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;doctor'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --ttl 'The lease length the checks judge against (a ZooKeeper session timeout, a restart''s hold-back), as `run --ttl`'
            cand --json 'Print one JSON object instead of the lines'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;prune'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --older-than 'Remove keys untouched for DURATION instead of 30 days (at least 1s)'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;check'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'The key whose job is watched; repeat for several (the worst state wins)'
            cand --key 'The key whose job is watched; repeat for several (the worst state wins)'
            cand -c 'CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job; -c as in the plugin guidelines)'
            cand --max-age 'CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job; -c as in the plugin guidelines)'
            cand -w 'WARNING when the newest run started longer ago than this (at most --max-age)'
            cand --warn-age 'WARNING when the newest run started longer ago than this (at most --max-age)'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;metrics'= {
            cand -b 'Lock backend [default: from the URL''s scheme, else file]'
            cand --backend 'Lock backend [default: from the URL''s scheme, else file]'
            cand -u 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand --url 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock'
            cand -k 'A key to report; repeat for several [default: every key with a run history]'
            cand --key 'A key to report; repeat for several [default: every key with a run history]'
            cand --write 'Write to FILE atomically (a temporary file beside it, then renamed) instead of stdout'
            cand -v 'Log acquire, renew and release events with timings'
            cand --verbose 'Log acquire, renew and release events with timings'
            cand -q 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand --quiet 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;completions'= {
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'dlock;help'= {
            cand run 'Run COMMAND while holding the lock KEY'
            cand acquire 'Take the lock KEY and keep it in the background until `dlock release`'
            cand release 'Give back a lock taken with `dlock acquire`; say whether it was held throughout'
            cand status 'Show who holds KEY, since when, and who waits'
            cand log 'Show the last runs under KEY: where, when, how long, how they ended'
            cand break 'Stop the holder of KEY and free the lock once it has stopped'
            cand bench 'Measure the backend: lock latency, hand-off latency and throughput'
            cand doctor 'Check the server and what stands between: can a lock there be sound?'
            cand prune 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)'
            cand check 'A monitoring plugin: did KEY''s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)'
            cand metrics 'Print the last runs and the locks as Prometheus metrics (for node_exporter''s textfile collector)'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'dlock;help;run'= {
        }
        &'dlock;help;acquire'= {
        }
        &'dlock;help;release'= {
        }
        &'dlock;help;status'= {
        }
        &'dlock;help;log'= {
        }
        &'dlock;help;break'= {
        }
        &'dlock;help;bench'= {
        }
        &'dlock;help;doctor'= {
        }
        &'dlock;help;prune'= {
        }
        &'dlock;help;check'= {
        }
        &'dlock;help;metrics'= {
        }
        &'dlock;help;completions'= {
        }
        &'dlock;help;help'= {
        }
    ]
    $completions[$command]
}
