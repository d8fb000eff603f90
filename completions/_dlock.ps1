
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'dlock' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'dlock'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'dlock' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run COMMAND while holding the lock KEY')
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Take the lock KEY and keep it in the background until `dlock release`')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Give back a lock taken with `dlock acquire`; say whether it was held throughout')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds KEY, since when, and who waits')
            [CompletionResult]::new('log', 'log', [CompletionResultType]::ParameterValue, 'Show the last runs under KEY: where, when, how long, how they ended')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Stop the holder of KEY and free the lock once it has stopped')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure the backend: lock latency, hand-off latency and throughput')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the server and what stands between: can a lock there be sound?')
            [CompletionResult]::new('prune', 'prune', [CompletionResultType]::ParameterValue, 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'A monitoring plugin: did KEY''s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)')
            [CompletionResult]::new('metrics', 'metrics', [CompletionResultType]::ParameterValue, 'Print the last runs and the locks as Prometheus metrics (for node_exporter''s textfile collector)')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'dlock;run' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease length on the server; renewed every ttl/3')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock [default: wait forever]')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock [default: wait forever]')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'After SIGTERM to the command (and what it started), how long before SIGKILL')
            [CompletionResult]::new('--reason', '--reason', [CompletionResultType]::ParameterName, 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy')
            [CompletionResult]::new('--once-per', '--once-per', [CompletionResultType]::ParameterName, 'Skip (exit 75, or -E''s code) when a run of KEY started less than DURATION ago on any host, by the backend''s clock; for cron on several hosts')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'Shared (reader) lock: many shared holders at once, or one exclusive holder')
            [CompletionResult]::new('--shared', '--shared', [CompletionResultType]::ParameterName, 'Shared (reader) lock: many shared holders at once, or one exclusive holder')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Try once; do not wait')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Try once; do not wait')
            [CompletionResult]::new('--no-history', '--no-history', [CompletionResultType]::ParameterName, 'Leave no record of this run in KEY''s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;acquire' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock''s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease length on the server; renewed every ttl/3')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock [default: wait forever]')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock [default: wait forever]')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'After SIGTERM to the command (and what it started), how long before SIGKILL')
            [CompletionResult]::new('--reason', '--reason', [CompletionResultType]::ParameterName, 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy')
            [CompletionResult]::new('--once-per', '--once-per', [CompletionResultType]::ParameterName, 'Skip (exit 75, or -E''s code) when a run of KEY started less than DURATION ago on any host, by the backend''s clock; for cron on several hosts')
            [CompletionResult]::new('-f', '-f', [CompletionResultType]::ParameterName, 'How to print the handle and the DLOCK_* variables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'How to print the handle and the DLOCK_* variables')
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'The process the lock is held for: released when it exits, its process group stopped (SIGTERM, SIGKILL after --kill-grace) if the lock is lost; `none` for nobody (needs --max-hold) [default: the process that runs dlock acquire]')
            [CompletionResult]::new('--max-hold', '--max-hold', [CompletionResultType]::ParameterName, 'Give the lock up after holding it this long (stopping the owner first)')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'Shared (reader) lock: many shared holders at once, or one exclusive holder')
            [CompletionResult]::new('--shared', '--shared', [CompletionResultType]::ParameterName, 'Shared (reader) lock: many shared holders at once, or one exclusive holder')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Try once; do not wait')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Try once; do not wait')
            [CompletionResult]::new('--no-history', '--no-history', [CompletionResultType]::ParameterName, 'Leave no record of this run in KEY''s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;release' {
            [CompletionResult]::new('--handle', '--handle', [CompletionResultType]::ParameterName, 'What `dlock acquire` printed as DLOCK_HANDLE')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;status' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The lock''s name; without it, every lock held or waited for on the backend, one line each')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock''s name; without it, every lock held or waited for on the backend, one line each')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object (key, backend, held, holders, ...); without --key, an array of them')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;log' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The lock''s name')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock''s name')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'How many runs to show, newest first')
            [CompletionResult]::new('--runs', '--runs', [CompletionResultType]::ParameterName, 'How many runs to show, newest first')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The old spelling of --runs: taken, with a warning, until a later release drops it (-n is --no-wait in run and acquire)')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print a JSON array of runs instead of text')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;break' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The lock''s name')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock''s name')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Wait until the broken holder has stopped and let go (at most DURATION when given)')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait until the broken holder has stopped and let go (at most DURATION when given)')
            [CompletionResult]::new('--force', '--force', [CompletionResultType]::ParameterName, 'Remove the lock now, without waiting for its holder to stop: UNSAFE, the next holder may start while the broken command still runs')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;bench' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'Contending clients (threads, each with its own connection) in the hand-off phase')
            [CompletionResult]::new('--clients', '--clients', [CompletionResultType]::ParameterName, 'Contending clients (threads, each with its own connection) in the hand-off phase')
            [CompletionResult]::new('-d', '-d', [CompletionResultType]::ParameterName, 'How long each phase runs [default: 3s]')
            [CompletionResult]::new('--duration', '--duration', [CompletionResultType]::ParameterName, 'How long each phase runs [default: 3s]')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Acquisitions per phase, instead of a duration')
            [CompletionResult]::new('--ops', '--ops', [CompletionResultType]::ParameterName, 'Acquisitions per phase, instead of a duration')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease length of the benchmark''s locks')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object instead of the table')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;doctor' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The lease length the checks judge against (a ZooKeeper session timeout, a restart''s hold-back), as `run --ttl`')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object instead of the lines')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;prune' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--older-than', '--older-than', [CompletionResultType]::ParameterName, 'Remove keys untouched for DURATION instead of 30 days (at least 1s)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;check' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'The key whose job is watched; repeat for several (the worst state wins)')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The key whose job is watched; repeat for several (the worst state wins)')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job; -c as in the plugin guidelines)')
            [CompletionResult]::new('--max-age', '--max-age', [CompletionResultType]::ParameterName, 'CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job; -c as in the plugin guidelines)')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'WARNING when the newest run started longer ago than this (at most --max-age)')
            [CompletionResult]::new('--warn-age', '--warn-age', [CompletionResultType]::ParameterName, 'WARNING when the newest run started longer ago than this (at most --max-age)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;metrics' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Lock backend [default: from the URL''s scheme, else file]')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'A key to report; repeat for several [default: every key with a run history]')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'A key to report; repeat for several [default: every key with a run history]')
            [CompletionResult]::new('--write', '--write', [CompletionResultType]::ParameterName, 'Write to FILE atomically (a temporary file beside it, then renamed) instead of stdout')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log acquire, renew and release events with timings')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;completions' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'dlock;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run COMMAND while holding the lock KEY')
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Take the lock KEY and keep it in the background until `dlock release`')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Give back a lock taken with `dlock acquire`; say whether it was held throughout')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds KEY, since when, and who waits')
            [CompletionResult]::new('log', 'log', [CompletionResultType]::ParameterValue, 'Show the last runs under KEY: where, when, how long, how they ended')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Stop the holder of KEY and free the lock once it has stopped')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure the backend: lock latency, hand-off latency and throughput')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the server and what stands between: can a lock there be sound?')
            [CompletionResult]::new('prune', 'prune', [CompletionResultType]::ParameterValue, 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'A monitoring plugin: did KEY''s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)')
            [CompletionResult]::new('metrics', 'metrics', [CompletionResultType]::ParameterValue, 'Print the last runs and the locks as Prometheus metrics (for node_exporter''s textfile collector)')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'dlock;help;run' {
            break
        }
        'dlock;help;acquire' {
            break
        }
        'dlock;help;release' {
            break
        }
        'dlock;help;status' {
            break
        }
        'dlock;help;log' {
            break
        }
        'dlock;help;break' {
            break
        }
        'dlock;help;bench' {
            break
        }
        'dlock;help;doctor' {
            break
        }
        'dlock;help;prune' {
            break
        }
        'dlock;help;check' {
            break
        }
        'dlock;help;metrics' {
            break
        }
        'dlock;help;completions' {
            break
        }
        'dlock;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
