# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_dlock_global_optspecs
    string join \n h/help V/version
end

function __fish_dlock_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_dlock_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_dlock_using_subcommand
    set -l cmd (__fish_dlock_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c dlock -n "__fish_dlock_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_needs_command" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "run" -d 'Run COMMAND while holding the lock KEY'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "acquire" -d 'Take the lock KEY and keep it in the background until `dlock release`'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "release" -d 'Give back a lock taken with `dlock acquire`; say whether it was held throughout'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "status" -d 'Show who holds KEY, since when, and who waits'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "log" -d 'Show the last runs under KEY: where, when, how long, how they ended'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "break" -d 'Stop the holder of KEY and free the lock once it has stopped'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "bench" -d 'Measure the backend: lock latency, hand-off latency and throughput'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "doctor" -d 'Check the server and what stands between: can a lock there be sound?'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "prune" -d 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "check" -d 'A monitoring plugin: did KEY\'s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "metrics" -d 'Print the last runs and the locks as Prometheus metrics (for node_exporter\'s textfile collector)'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand run" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -s k -l key -d 'The lock\'s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -s l -l limit -d 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -l ttl -d 'Lease length on the server; renewed every ttl/3' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -s w -l wait -d 'Give up after waiting this long for the lock [default: wait forever]' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -s E -l conflict-exit-code -d 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -l kill-grace -d 'After SIGTERM to the command (and what it started), how long before SIGKILL' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -l reason -d 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -l once-per -d 'Skip (exit 75, or -E\'s code) when a run of KEY started less than DURATION ago on any host, by the backend\'s clock; for cron on several hosts' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand run" -s s -l shared -d 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s n -l no-wait -d 'Try once; do not wait'
complete -c dlock -n "__fish_dlock_using_subcommand run" -l no-history -d 'Leave no record of this run in KEY\'s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand run" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s k -l key -d 'The lock\'s name (1-256 bytes of UTF-8, no control characters); repeat to hold several locks at once (taken in one fixed order, so runs never deadlock)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s l -l limit -d 'Semaphore: up to N holders of KEY at once; every user of KEY must give the same N' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l ttl -d 'Lease length on the server; renewed every ttl/3' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s w -l wait -d 'Give up after waiting this long for the lock [default: wait forever]' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s E -l conflict-exit-code -d 'Exit code when the lock was not acquired; 0 makes the skip a silent success (`run` only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l kill-grace -d 'After SIGTERM to the command (and what it started), how long before SIGKILL' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l reason -d 'Why the lock is taken: stored with the holder, shown by `status` and to whoever finds the lock busy' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l once-per -d 'Skip (exit 75, or -E\'s code) when a run of KEY started less than DURATION ago on any host, by the backend\'s clock; for cron on several hosts' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s f -l format -d 'How to print the handle and the DLOCK_* variables' -r -f -a "sh\t'`export NAME=\'value\'` lines, for `eval "$(dlock acquire ...)"`'
json\t'One JSON object'
github\t'`NAME=value` lines (heredoc form for several lines) to append to `$GITHUB_ENV`'
env\t'`NAME="value"` lines, for systemd\'s `EnvironmentFile=`'"
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l owner -d 'The process the lock is held for: released when it exits, its process group stopped (SIGTERM, SIGKILL after --kill-grace) if the lock is lost; `none` for nobody (needs --max-hold) [default: the process that runs dlock acquire]' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l max-hold -d 'Give the lock up after holding it this long (stopping the owner first)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s s -l shared -d 'Shared (reader) lock: many shared holders at once, or one exclusive holder'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s n -l no-wait -d 'Try once; do not wait'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -l no-history -d 'Leave no record of this run in KEY\'s history (`dlock log`); also DLOCK_NO_HISTORY=1, which --once-per overrides'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand acquire" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand release" -l handle -d 'What `dlock acquire` printed as DLOCK_HANDLE' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand release" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand status" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand status" -s k -l key -d 'The lock\'s name; without it, every lock held or waited for on the backend, one line each' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand status" -l json -d 'Print one JSON object (key, backend, held, holders, ...); without --key, an array of them'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand log" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand log" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand log" -s k -l key -d 'The lock\'s name' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand log" -s r -l runs -d 'How many runs to show, newest first' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand log" -s n -d 'The old spelling of --runs: taken, with a warning, until a later release drops it (-n is --no-wait in run and acquire)' -r
complete -c dlock -n "__fish_dlock_using_subcommand log" -l json -d 'Print a JSON array of runs instead of text'
complete -c dlock -n "__fish_dlock_using_subcommand log" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand log" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand log" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand log" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand break" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand break" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand break" -s k -l key -d 'The lock\'s name' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand break" -s w -l wait -d 'Wait until the broken holder has stopped and let go (at most DURATION when given)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand break" -l force -d 'Remove the lock now, without waiting for its holder to stop: UNSAFE, the next holder may start while the broken command still runs'
complete -c dlock -n "__fish_dlock_using_subcommand break" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand break" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand break" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand break" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s c -l clients -d 'Contending clients (threads, each with its own connection) in the hand-off phase' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s d -l duration -d 'How long each phase runs [default: 3s]' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s o -l ops -d 'Acquisitions per phase, instead of a duration' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand bench" -l ttl -d 'Lease length of the benchmark\'s locks' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand bench" -l json -d 'Print one JSON object instead of the table'
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand bench" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -l ttl -d 'The lease length the checks judge against (a ZooKeeper session timeout, a restart\'s hold-back), as `run --ttl`' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -l json -d 'Print one JSON object instead of the lines'
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand prune" -l older-than -d 'Remove keys untouched for DURATION instead of 30 days (at least 1s)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand prune" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand check" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand check" -s k -l key -d 'The key whose job is watched; repeat for several (the worst state wins)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand check" -s c -l max-age -d 'CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job; -c as in the plugin guidelines)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand check" -s w -l warn-age -d 'WARNING when the newest run started longer ago than this (at most --max-age)' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand check" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s b -l backend -d 'Lock backend [default: from the URL\'s scheme, else file]' -r -f -a "file\t'flock(2) on a lock file on this host'
redis\t'Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)'
zookeeper\t'ZooKeeper (ephemeral sequential nodes)'
mysql\t'MySQL or MariaDB (GET_LOCK)'
postgres\t'PostgreSQL (session advisory locks)'
etcd\t'etcd (the lock recipe of etcdctl lock)'
s3\t'S3 or a compatible server (conditional writes, a lease by observation)'"
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s u -l url -d 'Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or separate with spaces in DLOCK_URL) for Redlock' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s k -l key -d 'A key to report; repeat for several [default: every key with a run history]' -r -f
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -l write -d 'Write to FILE atomically (a temporary file beside it, then renamed) instead of stdout' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s v -l verbose -d 'Log acquire, renew and release events with timings'
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s q -l quiet -d 'Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is not one)'
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand metrics" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand completions" -s h -l help -d 'Print help'
complete -c dlock -n "__fish_dlock_using_subcommand completions" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "run" -d 'Run COMMAND while holding the lock KEY'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "acquire" -d 'Take the lock KEY and keep it in the background until `dlock release`'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "release" -d 'Give back a lock taken with `dlock acquire`; say whether it was held throughout'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "status" -d 'Show who holds KEY, since when, and who waits'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "log" -d 'Show the last runs under KEY: where, when, how long, how they ended'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "break" -d 'Stop the holder of KEY and free the lock once it has stopped'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "bench" -d 'Measure the backend: lock latency, hand-off latency and throughput'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "doctor" -d 'Check the server and what stands between: can a lock there be sound?'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "prune" -d 'Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "check" -d 'A monitoring plugin: did KEY\'s job run, recently and well? (exit 0 OK .. 3 UNKNOWN)'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "metrics" -d 'Print the last runs and the locks as Prometheus metrics (for node_exporter\'s textfile collector)'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "completions" -d 'Print a shell completion script'
complete -c dlock -n "__fish_dlock_using_subcommand help; and not __fish_seen_subcommand_from run acquire release status log break bench doctor prune check metrics completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
