//! The fixed shell scripts the runtime runs inside the container through `/v1/bash/exec`.
//!
//! Every value reaches a script through the request's `env` (never spliced into the command
//! text), so no path or command needs quoting. Scripts answer on stdout with one line:
//! `ok<TAB>fields...` or `err<TAB>code<TAB>detail`.

/// Shell functions shared by the background-command scripts (see [`SPAWN`]):
///
/// - `sb_ticks PID`: the start time of a live, non-zombie process (field 22 of its stat line),
///   which tells a recycled pid apart;
/// - `sb_now`: milliseconds since the epoch;
/// - `sb_state DIR`: sets `sb_st` to `running`, `ended` (then `sb_end` holds the end record) or
///   `lost` (no end record and no live runner);
/// - `sb_line DIR ID`: prints one command's status line,
///   `C ID STARTED LIMIT STATE STDOUT_SIZE STDERR_SIZE BASE64(COMMAND) END`, tab-separated, with
///   the state read before the sizes (so an ended state comes with final sizes).
macro_rules! common {
    () => {
        r#"sb_ticks() { sb_s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; sb_r=${sb_s##*") "}; set -- $sb_r; [ "$1" = Z ] && return 1; [ $# -ge 20 ] || return 1; shift 19; printf '%s' "$1"; }
sb_now() { date +%s%3N; }
sb_state() {
  sb_end=
  if [ -f "$1/end" ]; then sb_st=ended; IFS= read -r sb_end < "$1/end"; return 0; fi
  if [ -f "$1/runner" ]; then
    read -r sb_rp sb_rt < "$1/runner"
    if [ "$(sb_ticks "$sb_rp")" = "$sb_rt" ]; then sb_st=running; return 0; fi
    if [ -f "$1/end" ]; then sb_st=ended; IFS= read -r sb_end < "$1/end"; return 0; fi
    sb_st=lost; return 0
  fi
  read -r sb_t0 < "$1/started" 2>/dev/null || sb_t0=0
  if [ $(( $(sb_now) - sb_t0 )) -lt 10000 ]; then sb_st=running; else sb_st=lost; fi
}
sb_size() { if [ -f "$1" ]; then stat -c %s -- "$1"; else printf '0\n'; fi; }
sb_line() {
  sb_state "$1"
  read -r sb_t0 < "$1/started" 2>/dev/null || sb_t0=0
  read -r sb_l < "$1/limit" 2>/dev/null || sb_l=0
  sb_o=$(sb_size "$1/o"); sb_e=$(sb_size "$1/e")
  sb_c=$(base64 -w 0 < "$1/cmd" 2>/dev/null)
  printf 'C\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$sb_t0" "$sb_l" "$sb_st" "$sb_o" "$sb_e" "$sb_c" "$sb_end"
}
"#
    };
}

/// Creates the conversations root and the workspace (mode 0700), refusing a workspace that is a
/// symbolic link. Env: `SB_ROOT`, `SB_WS`.
pub(crate) const OPEN: &str = r#"set -u
mkdir -p -- "$SB_ROOT" || { printf 'err\tio\tcannot create the conversations root\n'; exit 0; }
if [ -L "$SB_WS" ]; then printf 'err\toutside\tthe workspace is a symbolic link\n'; exit 0; fi
mkdir -m 700 -- "$SB_WS" 2>/dev/null || [ -d "$SB_WS" ] || { printf 'err\tio\tcannot create the workspace\n'; exit 0; }
printf 'ok\n'"#;

/// Wraps a caller's command: enters the working directory, checks that its real path is inside
/// the workspace's real path, then runs the command with `/bin/sh -c`, its stdout and stderr
/// going to files `o` and `e` in a new directory `SB_OUT` (mode 0700). When the command has
/// ended it prints, on its own stdout, the exact bytes as base64 (at most `SB_LIMIT` bytes of
/// each stream), then removes the directory and exits with the command's status:
///
/// ```text
/// sessionbox-aio:1 STATUS
/// BASE64 OF STDOUT
/// BASE64 OF STDERR
/// sessionbox-aio:end
/// ```
///
/// AIO's `/v1/bash/exec` carries output as JSON text decoded from UTF-8 (so bytes that are not
/// UTF-8 are lost there); base64 is ASCII and survives. When the wrapper is killed (timeout,
/// kill) the files stay and [`COLLECT`] reads them. Env: `SB_WS`, `SB_CWD`, `SB_CMD`,
/// `SB_OUT`, `SB_LIMIT`, optionally `SB_STDIN` (base64). Refusals exit 125 with a marker line
/// on stderr.
pub(crate) const EXEC: &str = r#"sb_w=$(realpath -e -- "$SB_WS" 2>/dev/null) || { printf 'sessionbox-aio:no-workspace\n' >&2; exit 125; }
cd -P -- "$SB_CWD" 2>/dev/null || { printf 'sessionbox-aio:cwd-missing\n' >&2; exit 125; }
case "$(pwd -P)/" in "$sb_w"/*) ;; *) printf 'sessionbox-aio:cwd-outside\n' >&2; exit 125;; esac
sb_o=$SB_OUT
mkdir -m 700 -- "$sb_o" 2>/dev/null || { mkdir -p -- "${sb_o%/*}" 2>/dev/null && mkdir -m 700 -- "$sb_o"; } 2>/dev/null || { printf 'sessionbox-aio:no-output-dir\n' >&2; exit 125; }
sb_cmd=$SB_CMD; sb_in=${SB_STDIN-}; sb_has_in=${SB_STDIN+1}; sb_l=$SB_LIMIT
unset SB_WS SB_CWD SB_CMD SB_STDIN SB_OUT SB_LIMIT sb_w
if [ -n "$sb_has_in" ]; then
  printf '%s' "$sb_in" | base64 -d | /bin/sh -c "$sb_cmd" >"$sb_o/o" 2>"$sb_o/e"
else
  /bin/sh -c "$sb_cmd" </dev/null >"$sb_o/o" 2>"$sb_o/e"
fi
sb_rc=$?
printf 'sessionbox-aio:1 %s\n' "$sb_rc"
[ -s "$sb_o/o" ] && head -c "$sb_l" -- "$sb_o/o" | base64 -w 0
printf '\n'
[ -s "$sb_o/e" ] && head -c "$sb_l" -- "$sb_o/e" | base64 -w 0
printf '\nsessionbox-aio:end\n'
rm -rf -- "$sb_o"
exit "$sb_rc""#;

/// Reads what a command wrapped by [`EXEC`] left in `SB_OUT` when the wrapper did not get to
/// print it (killed at its timeout, or by a kill), in [`EXEC`]'s format with `-` as the status,
/// and removes the directory; prints `sessionbox-aio:gone` when there is no such directory.
/// Env: `SB_OUT`, `SB_LIMIT`.
pub(crate) const COLLECT: &str = r#"[ -d "$SB_OUT" ] || { printf 'sessionbox-aio:gone\n'; exit 0; }
printf 'sessionbox-aio:1 -\n'
[ -s "$SB_OUT/o" ] && head -c "$SB_LIMIT" -- "$SB_OUT/o" | base64 -w 0
printf '\n'
[ -s "$SB_OUT/e" ] && head -c "$SB_LIMIT" -- "$SB_OUT/e" | base64 -w 0
printf '\nsessionbox-aio:end\n'
rm -rf -- "$SB_OUT""#;

/// Directory, beside the workspaces under the conversations root, holding the per-command
/// output directories of [`EXEC`] (named `<key>.<unique>`, removed when the command ends).
pub(crate) const EXEC_OUTPUT_DIR: &str = ".sessionbox-exec";

/// Exit code [`EXEC`] uses when it refuses.
pub(crate) const EXEC_REFUSED: i32 = 125;

/// The file-operation checks. `SB_OP` selects one; `SB_WS` is the workspace, `SB_PATH` the
/// target as the runtime presents it (already through the path policy). Each resolves real
/// paths with `realpath` and refuses a target whose real path is not inside the workspace's.
///
/// - `read`: an existing regular file -> `ok SIZE REALPATH`.
/// - `write`: parent made (`mkdir -p`), target not a directory nor hard-linked ->
///   `ok REALPATH REALDIR`.
/// - `commit`: renames `SB_TMP` over `SB_PATH` (a real path from `write`) after checking both
///   again -> `ok`.
/// - `base`: an existing file or directory -> `ok KIND REALPATH REALWS`, then, when `SB_LINKS`
///   is set, every symbolic link under it, one absolute path per line.
/// - `stat`: -> `ok TYPE|SIZE|MODE|MTIME` (`stat -L`).
/// - `mkdir`, `remove` (`SB_RECURSIVE=1` for trees): -> `ok`.
pub(crate) const FILE_OP: &str = r#"set -u
fail() { printf 'err\t%s\t%s\n' "$1" "$2"; exit 0; }
w=$(realpath -e -- "$SB_WS" 2>/dev/null) || fail not_found "the workspace does not exist"
inside() { case "$1/" in "$w"/*) return 0;; *) return 1;; esac; }
p=$SB_PATH
case "$SB_OP" in
read)
  r=$(realpath -e -- "$p" 2>/dev/null) || fail not_found "no such file"
  inside "$r" || fail outside "a symbolic link leads out of the workspace"
  [ -d "$r" ] && fail is_dir "is a directory"
  [ -f "$r" ] || fail not_file "not a regular file"
  printf 'ok\t%s\t%s\n' "$(stat -c %s -- "$r")" "$r" ;;
write)
  d=$(realpath -m -- "$(dirname -- "$p")") || fail io "cannot resolve the parent"
  inside "$d" || fail outside "a symbolic link leads out of the workspace"
  if [ -e "$p" ] || [ -L "$p" ]; then
    r=$(realpath -m -- "$p") || fail io "cannot resolve the path"
    inside "$r" || fail outside "a symbolic link leads out of the workspace"
    [ -d "$r" ] && fail is_dir "is a directory"
    if [ -e "$r" ] && [ "$(stat -c %h -- "$r")" -gt 1 ]; then fail hardlink "the file has more than one hard link"; fi
    d=$(dirname -- "$r")
  else
    r="$d/$(basename -- "$p")"
  fi
  if [ -e "$d" ] && [ ! -d "$d" ]; then fail not_dir "a parent is not a directory"; fi
  mkdir -p -- "$d" 2>/dev/null || fail io "cannot create the parent directory"
  d2=$(realpath -e -- "$d") || fail io "cannot resolve the parent"
  inside "$d2" || fail outside "a symbolic link leads out of the workspace"
  printf 'ok\t%s\t%s\n' "$r" "$d2" ;;
commit)
  t=$SB_TMP
  rt=$(realpath -e -- "$t" 2>/dev/null) || fail not_found "the temporary file vanished"
  inside "$rt" || { rm -f -- "$t"; fail outside "a symbolic link leads out of the workspace"; }
  r=$(realpath -m -- "$p")
  inside "$r" || { rm -f -- "$t"; fail outside "a symbolic link leads out of the workspace"; }
  [ -d "$r" ] && { rm -f -- "$t"; fail is_dir "is a directory"; }
  if [ -e "$r" ] && [ "$(stat -c %h -- "$r")" -gt 1 ]; then rm -f -- "$t"; fail hardlink "the file has more than one hard link"; fi
  mv -f -T -- "$t" "$r" 2>/dev/null || { rm -f -- "$t"; fail io "cannot rename the temporary file"; }
  printf 'ok\n' ;;
base)
  r=$(realpath -e -- "$p" 2>/dev/null) || fail not_found "no such file or directory"
  inside "$r" || fail outside "a symbolic link leads out of the workspace"
  if [ -d "$r" ]; then k=dir; else k=file; fi
  printf 'ok\t%s\t%s\t%s\n' "$k" "$r" "$w"
  if [ -n "${SB_LINKS-}" ] && [ "$k" = dir ]; then find "$r" -type l 2>/dev/null | head -n 100000; fi ;;
stat)
  r=$(realpath -e -- "$p" 2>/dev/null) || fail not_found "no such file or directory"
  inside "$r" || fail outside "a symbolic link leads out of the workspace"
  printf 'ok\t%s\n' "$(stat -L -c '%F|%s|%a|%Y' -- "$r")" ;;
mkdir)
  r=$(realpath -m -- "$p") || fail io "cannot resolve the path"
  inside "$r" || fail outside "a symbolic link leads out of the workspace"
  if [ -e "$r" ] && [ ! -d "$r" ]; then fail exists "a file of that name exists"; fi
  mkdir -p -- "$r" 2>/dev/null || fail io "cannot create the directory"
  r2=$(realpath -e -- "$r") || fail io "cannot resolve the directory"
  inside "$r2" || fail outside "a symbolic link leads out of the workspace"
  printf 'ok\n' ;;
remove)
  [ -e "$p" ] || [ -L "$p" ] || fail not_found "no such file or directory"
  d=$(realpath -e -- "$(dirname -- "$p")" 2>/dev/null) || fail not_found "no such directory"
  inside "$d" || fail outside "a symbolic link leads out of the workspace"
  t="$d/$(basename -- "$p")"
  [ "$t" = "$w" ] && fail root "the workspace root cannot be removed; destroy the conversation"
  if [ -d "$t" ] && [ ! -L "$t" ]; then
    if [ "${SB_RECURSIVE-}" = 1 ]; then rm -rf -- "$t" 2>/dev/null || fail io "cannot remove the directory";
    else rmdir -- "$t" 2>/dev/null || fail not_empty "the directory is not empty"; fi
  else
    rm -f -- "$t" 2>/dev/null || fail io "cannot remove the file"
  fi
  printf 'ok\n' ;;
*) fail invalid "unknown operation" ;;
esac"#;

/// Kills every process whose working directory is inside `SB_WS` and every background command
/// of the conversation (its runner's and its command's process groups, recorded in
/// [`COMMANDS_DIR`]), without waiting for them to record an end; then, when `SB_REMOVE=1`,
/// removes the workspace, the commands' directory, any output directories its commands left
/// in [`EXEC_OUTPUT_DIR`] and any archive temporaries left in [`ARCHIVES_DIR`]. Prints
/// `ok KILLED REMOVED`. `SB_WS` is always
/// `<root>/<64 hex digits>`.
pub(crate) const DESTROY: &str = concat!(
    common!(),
    r#"set -u
W=$(realpath -m -- "$SB_WS")
killed=0
C="${SB_WS%/*}/.sessionbox-commands/${SB_WS##*/}"
if [ -d "$C" ]; then
  for x in "$C"/*/; do
    x=${x%/}
    [ -d "$x" ] || continue
    if [ -f "$x/runner" ] && read -r rp rt < "$x/runner" && [ "$(sb_ticks "$rp")" = "$rt" ]; then
      kill -s KILL -- "-$rp" 2>/dev/null && killed=$((killed+1))
    fi
    if [ ! -f "$x/end" ] && [ -f "$x/pid" ] && read -r p < "$x/pid"; then
      kill -s KILL -- "-$p" 2>/dev/null && killed=$((killed+1))
    fi
  done
  [ "${SB_REMOVE-}" = 1 ] && rm -rf -- "$C" 2>/dev/null
fi
for i in 1 2 3 4 5; do
  found=0
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = "$$" ] && continue
    c=$(readlink "$d/cwd" 2>/dev/null) || continue
    case "$c/" in "$W"/*) kill -9 "$pid" 2>/dev/null && { killed=$((killed+1)); found=1; } ;; esac
  done
  [ "$found" = 0 ] && break
  sleep 0.05
done
removed=0
if [ "${SB_REMOVE-}" = 1 ] && { [ -e "$SB_WS" ] || [ -L "$SB_WS" ]; }; then
  # Read-only directories (a restore makes them as the archive says) cannot be emptied as
  # they are by a user other than root.
  for t in "$SB_WS" "${SB_WS%/*}/.sessionbox-archives/${SB_WS##*/}".*; do
    [ -d "$t" ] && [ ! -L "$t" ] && find "$t" -type d ! -perm -u=rwx -exec chmod u+rwx -- {} \; 2>/dev/null
  done
  rm -rf -- "$SB_WS" 2>/dev/null && removed=1
  rm -rf -- "${SB_WS%/*}/.sessionbox-exec/${SB_WS##*/}".* 2>/dev/null
  rm -rf -- "${SB_WS%/*}/.sessionbox-archives/${SB_WS##*/}".* 2>/dev/null
  [ -e "$SB_WS" ] && { printf 'err\tio\tcannot remove the workspace\n'; exit 0; }
fi
printf 'ok\t%s\t%s\n' "$killed" "$removed""#
);

/// Lists the workspaces under `SB_ROOT` (`D NAME`) and the processes whose working directory
/// is inside one (`P PID NAME`).
pub(crate) const INVENTORY: &str = r#"set -u
[ -d "$SB_ROOT" ] || exit 0
R=$(realpath -e -- "$SB_ROOT") || exit 0
for d in "$R"/*; do [ -d "$d" ] && printf 'D\t%s\n' "${d##*/}"; done
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [ "$pid" = "$$" ] && continue
  c=$(readlink "$d/cwd" 2>/dev/null) || continue
  case "$c/" in "$R"/*) k=${c#"$R"/}; printf 'P\t%s\t%s\n' "$pid" "${k%%/*}" ;; esac
done"#;

/// Directory, beside the workspaces under the conversations root (mode 0700), holding the
/// temporary files of workspace archives: `<key>.<unique>.tar` (an archive being taken or
/// restored) and `<key>.<unique>.d` (a restore's staging directory). Each lives for one
/// operation; [`DESTROY`] removes what a failed one left.
pub(crate) const ARCHIVES_DIR: &str = ".sessionbox-archives";

/// Shell functions that pause and resume a conversation's background commands (the `common`
/// functions first):
///
/// - `sb_pause`: sends `SIGSTOP` to the process group of every running command in `SB_CMDS`
///   (its `pid` file names the group: each command runs under `setsid`), remembers them in
///   `sb_paused`, then waits up to 2 s until no process of those groups is still running. A
///   running command without a readable `pid` resumes the others and ends the script with
///   `err busy ID`. Processes that left their command's group (a `setsid` of their own) are
///   not paused.
/// - `sb_resume`: sends `SIGCONT` to the groups paused.
macro_rules! pausing {
    () => {
        r#"sb_paused=
sb_resume() { for sb_p in $sb_paused; do kill -s CONT -- "-$sb_p" 2>/dev/null; done; sb_paused=; }
sb_settle() {
  [ -n "$sb_paused" ] || return 0
  sb_i=0
  while [ "$sb_i" -lt 200 ]; do
    sb_busy=0
    for sb_d in /proc/[0-9]*; do
      read -r sb_s 2>/dev/null < "$sb_d/stat" || continue
      set -- ${sb_s##*") "}
      case " $sb_paused " in *" $3 "*) case "$1" in T|t|Z|X) ;; *) sb_busy=1; break ;; esac ;; esac
    done
    [ "$sb_busy" = 0 ] && return 0
    sleep 0.01; sb_i=$((sb_i + 1))
  done
}
sb_pause() {
  [ -d "$SB_CMDS" ] || return 0
  for sb_x in "$SB_CMDS"/*/; do
    sb_x=${sb_x%/}
    [ -d "$sb_x" ] || continue
    sb_state "$sb_x"
    [ "$sb_st" = running ] || continue
    sb_p=
    [ -f "$sb_x/pid" ] && read -r sb_p < "$sb_x/pid"
    case "$sb_p" in
      ''|*[!0-9]*) sb_resume; printf 'err\tbusy\t%s\n' "${sb_x##*/}"; exit 0 ;;
    esac
    kill -s STOP -- "-$sb_p" 2>/dev/null
    sb_paused="$sb_paused $sb_p"
  done
  sb_settle
}
"#
    };
}

/// Takes an archive of the workspace `SB_WS` into `SB_TMP` (in [`ARCHIVES_DIR`]) with GNU tar:
/// `--format=gnu` (names kept byte for byte, whatever the locale), `--hard-dereference` (a
/// hard link stored as a file), symbolic links stored, never followed; sockets are left out
/// by tar and counted from its warnings. The conversation's background commands (`SB_CMDS`)
/// are paused for the length of it (see `pausing`). Answers `ok SIZE SOCKETS`, or
/// `err CODE DETAIL` (`not_found`, `busy ID`, `changed` when tar saw a file change as it read
/// it, `tar`, `io`), removing `SB_TMP` on an error. Env: `SB_WS`, `SB_TMP`, `SB_CMDS`.
pub(crate) const ARCHIVE: &str = concat!(
    common!(),
    pausing!(),
    r#"set -u
one_line() { printf '%s' "$1" | grep -v ': socket ignored$' | head -c 600 | tr '\t\n' '  '; }
fail() { sb_resume; rm -f -- "$SB_TMP"; printf 'err\t%s\t%s\n' "$1" "$2"; exit 0; }
w=$(realpath -e -- "$SB_WS" 2>/dev/null) || fail not_found "the workspace no longer exists"
[ -d "$w" ] || fail not_found "the workspace is not a directory"
A=${SB_TMP%/*}
{ mkdir -p -- "$A" && chmod 700 -- "$A"; } 2>/dev/null || fail io "cannot create the archives directory"
sb_pause
sb_err=$(LC_ALL=C tar -C "$w" --format=gnu --hard-dereference -cf "$SB_TMP" . 2>&1)
sb_rc=$?
sb_resume
case "$sb_rc" in
  0) ;;
  1) fail changed "$(one_line "$sb_err")" ;;
  *) fail tar "$(one_line "$sb_err")" ;;
esac
sockets=$(printf '%s\n' "$sb_err" | grep -c ': socket ignored$')
size=$(stat -c %s -- "$SB_TMP" 2>/dev/null) || fail io "the archive vanished"
printf 'ok\t%s\t%s\n' "$size" "$sockets""#
);

/// Replaces the contents of the workspace `SB_WS` with the archive `SB_TMP` (uploaded into
/// [`ARCHIVES_DIR`], already checked and rewritten in the canonical form by the runtime):
///
/// 1. checks that `SB_TMP` still has the size `SB_SIZE` and the SHA-256 `SB_SHA256` of what
///    was sent (another process of the container could have replaced it);
/// 2. extracts it with GNU tar into a new staging directory `SB_STAGE` beside it, keeping the
///    permission bits (`--same-permissions`; set-id bits are gone already), not the owners
///    (`--no-same-owner`), directories' modes set once their contents are in
///    (`--delay-directory-restore`); GNU tar also turns a link whose target is absolute or
///    climbs with `..` into a placeholder until the end, so nothing is written through it.
///    A failure here leaves the workspace as it was;
/// 3. pauses the conversation's background commands (`SB_CMDS`), removes the workspace's
///    contents (making its directories writable first), moves the staged entries in (a
///    read-only directory made writable for its move and given its mode back), resumes them.
///
/// Answers `ok` or `err CODE DETAIL` (`not_found`, `changed`, `tar`, `io`, `busy ID`), and
/// removes `SB_TMP` and `SB_STAGE` either way. Env: `SB_WS`, `SB_TMP`, `SB_SIZE`,
/// `SB_SHA256`, `SB_STAGE`, `SB_CMDS`.
pub(crate) const RESTORE: &str = concat!(
    common!(),
    pausing!(),
    r#"set -u
one_line() { printf '%s' "$1" | head -c 600 | tr '\t\n' '  '; }
sb_rm() { [ -e "$1" ] || return 0; find "$1" -type d ! -perm -u=rwx -exec chmod u+rwx -- {} \; 2>/dev/null; rm -rf -- "$1" 2>/dev/null; }
fail() { sb_resume; sb_rm "$SB_STAGE"; rm -f -- "$SB_TMP"; printf 'err\t%s\t%s\n' "$1" "$2"; exit 0; }
w=$(realpath -e -- "$SB_WS" 2>/dev/null) || fail not_found "the workspace no longer exists"
[ -d "$w" ] || fail not_found "the workspace is not a directory"
[ "$(stat -c %s -- "$SB_TMP" 2>/dev/null)" = "$SB_SIZE" ] || fail changed "the uploaded archive does not have the size sent"
[ "$(sha256sum < "$SB_TMP" | cut -d ' ' -f 1)" = "$SB_SHA256" ] || fail changed "the uploaded archive is not the archive sent"
mkdir -m 700 -- "$SB_STAGE" 2>/dev/null || fail io "cannot create the staging directory"
sb_err=$(LC_ALL=C tar -C "$SB_STAGE" -xf "$SB_TMP" --no-same-owner --same-permissions --delay-directory-restore 2>&1) || fail tar "$(one_line "$sb_err")"
rm -f -- "$SB_TMP"
sb_pause
find "$w" -mindepth 1 -type d ! -perm -u=rwx -exec chmod u+rwx -- {} \; 2>/dev/null
find "$w" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + 2>/dev/null
[ -z "$(ls -A -- "$w" 2>/dev/null)" ] || fail io "cannot empty the workspace (it is left partly emptied; restore again)"
for e in "$SB_STAGE"/* "$SB_STAGE"/.[!.]* "$SB_STAGE"/..?*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=${e##*/}
  if [ -d "$e" ] && [ ! -L "$e" ] && [ ! -w "$e" ]; then
    m=$(stat -c %a -- "$e")
    { chmod u+w -- "$e" && mv -f -- "$e" "$w/$n" && chmod "$m" -- "$w/$n"; } 2>/dev/null
  else
    mv -f -- "$e" "$w/$n" 2>/dev/null
  fi || fail io "cannot move $n into the workspace (it is left partly restored; restore again)"
done
rmdir -- "$SB_STAGE" 2>/dev/null
sb_resume
printf 'ok\n'"#
);

/// After an archive or a restore that did not finish (its script failed or was killed):
/// resumes every running background command's process group in `SB_CMDS` (`SIGCONT`, which
/// a group that was not paused ignores) and removes `SB_TMP` and `SB_STAGE` when set. Prints
/// `ok`.
pub(crate) const CLEANUP: &str = concat!(
    common!(),
    r#"if [ -d "$SB_CMDS" ]; then
  for x in "$SB_CMDS"/*/; do
    x=${x%/}
    [ -d "$x" ] || continue
    sb_state "$x"
    [ "$sb_st" = running ] || continue
    read -r p 2>/dev/null < "$x/pid" && kill -s CONT -- "-$p" 2>/dev/null
  done
fi
[ -n "${SB_TMP-}" ] && rm -f -- "$SB_TMP"
if [ -n "${SB_STAGE-}" ] && [ -e "$SB_STAGE" ]; then
  find "$SB_STAGE" -type d ! -perm -u=rwx -exec chmod u+rwx -- {} \; 2>/dev/null
  rm -rf -- "$SB_STAGE"
fi
printf 'ok\n'"#
);

/// Directory, beside the workspaces under the conversations root, holding the background
/// commands: `<root>/.sessionbox-commands/<key>/<id>/` (each 0700), one directory per command:
///
/// - `cmd`: the command text; `started`: the start time (ms since the epoch, the container's
///   clock); `limit`: the output limit in bytes; `in`: its stdin, when it has one;
/// - `o`, `e`: its stdout and stderr, at most one byte past the limit each (a pipe into
///   `dd iflag=count_bytes` keeps them, each read written at once, then `cat` drains and
///   discards the rest, so a chatty command cannot fill the container's disk; the extra byte
///   tells "cut" from "exactly full"); `o.fifo`, `e.fifo`: those pipes, while it runs;
/// - `pid`: the command's pid, which is its process group (it runs under `setsid`);
/// - `runner`: `PID STARTTIME` of the detached shell that waits for it ([`RUNNER`]);
/// - `killed`, `timedout`: markers written before the kill that they name;
/// - `end`: `code N|signal N FINISHED_MS TIMED_OUT KILLED`, written once, atomically (a
///   temporary file, then a rename) after both output pipes are drained.
///
/// Everything lives in the container, so a restarted `serve` (a new runtime) finds it all.
pub(crate) const COMMANDS_DIR: &str = ".sessionbox-commands";

/// The detached runner of one background command, started by [`SPAWN`] under `setsid` (a
/// session of its own, so closing the AIO bash session that started it does not end it). It
/// starts the two output pipes, runs `/bin/sh -c "$SB_CMD"` in a process group of its own (so a
/// kill of that group leaves the runner alive to record the end), enforces the timeout with a
/// watchdog, kills what the command left in its group when it ends, waits for the pipes and
/// writes `end`. Env (from [`SPAWN`]): `SB_D`, `SB_RCWD`, `SB_CMD`, `SB_LIMIT` (the limit plus
/// one), `SB_TIMEOUT` (seconds), and the command's own environment.
pub(crate) const RUNNER: &str = concat!(
    common!(),
    r#"d=$SB_D
sb_cmd=$SB_CMD; sb_l=$SB_LIMIT; sb_to=$SB_TIMEOUT; sb_cwd=$SB_RCWD
unset SB_D SB_CMD SB_LIMIT SB_TIMEOUT SB_RCWD SB_RUNNER SB_WS SB_CWD SB_STDIN SB_CMDS SB_ID SB_MAX_RUNNING SB_KEEP SB_OUTPUT_LIMIT
sb_t=$(sb_ticks $$)
{ dd bs=65536 iflag=count_bytes count="$sb_l" status=none > "$d/o"; cat > /dev/null; } < "$d/o.fifo" &
fo=$!
{ dd bs=65536 iflag=count_bytes count="$sb_l" status=none > "$d/e"; cat > /dev/null; } < "$d/e.fifo" &
fe=$!
if [ -f "$d/in" ]; then sb_in="$d/in"; else sb_in=/dev/null; fi
cd -- "$sb_cwd" 2>/dev/null || cd /
setsid /bin/sh -c "$sb_cmd" < "$sb_in" > "$d/o.fifo" 2> "$d/e.fifo" &
p=$!
printf '%s\n' "$p" > "$d/pid.tmp" && mv -f -- "$d/pid.tmp" "$d/pid"
printf '%s %s\n' "$$" "$sb_t" > "$d/runner.tmp" && mv -f -- "$d/runner.tmp" "$d/runner"
( sleep "$sb_to" & s=$!; trap 'kill "$s" 2>/dev/null; exit 0' TERM; wait "$s"; : > "$d/timedout"; kill -s KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
w=$!
wait "$p"; rc=$?
kill "$w" 2>/dev/null
kill -s KILL -- "-$p" 2>/dev/null
wait "$fo" "$fe"
fin=$(sb_now)
if [ -f "$d/timedout" ]; then to=1; else to=0; fi
if [ -f "$d/killed" ]; then k=1; else k=0; fi
if [ "$rc" -gt 128 ] && [ "$rc" -le 192 ]; then kind=signal; v=$((rc - 128)); else kind=code; v=$rc; fi
printf '%s %s %s %s %s\n' "$kind" "$v" "$fin" "$to" "$k" > "$d/end.tmp" && mv -f -- "$d/end.tmp" "$d/end"
rm -f -- "$d/o.fifo" "$d/e.fifo""#
);

/// Starts a background command: checks the workspace and the working directory as [`EXEC`]
/// does, then, under an exclusive lock on the conversation's commands directory, counts the
/// running commands (refusing at `SB_MAX_RUNNING`), removes the oldest ended ones past
/// `SB_KEEP`, makes the command's directory `SB_CMDS/SB_ID` (0700), and starts [`RUNNER`]
/// detached; answers once the runner has recorded itself: `ok STARTED_MS`, or
/// `err CODE DETAIL` (`busy`, `not_found`, `cwd_missing`, `outside`, `io`). Env: `SB_WS`,
/// `SB_CWD`, `SB_CMD`, `SB_CMDS`, `SB_ID`, `SB_MAX_RUNNING`, `SB_KEEP`, `SB_OUTPUT_LIMIT`,
/// `SB_LIMIT`, `SB_TIMEOUT`, `SB_RUNNER`, optionally `SB_STDIN` (base64).
pub(crate) const SPAWN: &str = concat!(
    common!(),
    r#"set -u
fail() { printf 'err\t%s\t%s\n' "$1" "$2"; exit 0; }
sb_w=$(realpath -e -- "$SB_WS" 2>/dev/null) || fail not_found "the workspace no longer exists"
cd -P -- "$SB_CWD" 2>/dev/null || fail cwd_missing "no such directory"
sb_cwd=$(pwd -P)
case "$sb_cwd/" in "$sb_w"/*) ;; *) fail outside "a symbolic link leads out of the workspace";; esac
cd /
C=$SB_CMDS
mkdir -p -- "${C%/*}" 2>/dev/null && chmod 700 -- "${C%/*}" 2>/dev/null
mkdir -m 700 -- "$C" 2>/dev/null || [ -d "$C" ] || fail io "cannot create the commands directory"
exec 9> "$C/.lock" || fail io "cannot open the commands lock"
if command -v flock >/dev/null 2>&1; then flock 9 || fail io "cannot lock the commands directory"; fi
running=0
for x in "$C"/*/; do
  x=${x%/}
  [ -d "$x" ] || continue
  sb_state "$x"
  [ "$sb_st" = running ] && running=$((running + 1))
done
[ "$running" -ge "$SB_MAX_RUNNING" ] && fail busy "$running"
for x in "$C"/*/; do
  x=${x%/}
  [ -d "$x" ] || continue
  sb_state "$x"
  [ "$sb_st" = running ] && continue
  read -r t < "$x/started" 2>/dev/null || t=0
  printf '%s %s\n' "$t" "$x"
done | sort -n | head -n "-$((SB_KEEP - 1))" | while read -r t x; do rm -rf -- "$x"; done
D="$C/$SB_ID"
mkdir -m 700 -- "$D" 2>/dev/null || fail io "cannot create the command's directory"
printf '%s' "$SB_CMD" > "$D/cmd" || fail io "cannot write the command"
printf '%s\n' "$SB_OUTPUT_LIMIT" > "$D/limit"
if [ -n "${SB_STDIN+1}" ]; then printf '%s' "$SB_STDIN" | base64 -d > "$D/in" || fail io "cannot write stdin"; fi
mkfifo -m 600 -- "$D/o.fifo" "$D/e.fifo" || fail io "cannot create the output pipes"
printf '%s\n' "$(sb_now)" > "$D/started"
SB_D=$D SB_RCWD=$sb_cwd setsid /bin/sh -c "$SB_RUNNER" sb-runner </dev/null >/dev/null 2>"$D/runner.log" 9>&- &
i=0
while [ ! -f "$D/runner" ] && [ "$i" -lt 500 ]; do sleep 0.01; i=$((i + 1)); done
[ -f "$D/runner" ] || fail io "the command's runner did not start"
read -r t0 < "$D/started"
printf 'ok\t%s\n' "$t0""#
);

/// Prints the status line (see the `common` functions) of every background command in
/// `SB_CMDS`, or of `SB_CMDS/SB_ID` alone when `SB_ID` is set (`sessionbox-aio:gone` when it
/// does not exist).
pub(crate) const STATUS: &str = concat!(
    common!(),
    r#"if [ -n "${SB_ID-}" ]; then
  [ -f "$SB_CMDS/$SB_ID/started" ] || { printf 'sessionbox-aio:gone\n'; exit 0; }
  sb_line "$SB_CMDS/$SB_ID" "$SB_ID"
  exit 0
fi
[ -d "$SB_CMDS" ] || exit 0
for x in "$SB_CMDS"/*/; do
  x=${x%/}
  [ -f "$x/started" ] || continue
  sb_line "$x" "${x##*/}"
done"#
);

/// Reads a background command's output from the offsets `SB_OF` (stdout) and `SB_EF` (stderr):
/// when there is nothing past both and it still runs, polls every 50 ms for up to `SB_WAIT_MS`.
/// Prints its status line, then at most `SB_MAX` bytes of each stream from its offset (never
/// past the limit) as base64 on a line each, then `sessionbox-aio:end`;
/// `sessionbox-aio:gone` when the command does not exist. Env: `SB_D`, `SB_ID`, `SB_OF`,
/// `SB_EF`, `SB_MAX`, `SB_WAIT_MS`.
pub(crate) const OUTPUT: &str = concat!(
    common!(),
    r#"[ -f "$SB_D/started" ] || { printf 'sessionbox-aio:gone\n'; exit 0; }
read -r l < "$SB_D/limit"
dl=$(( $(sb_now) + SB_WAIT_MS ))
while :; do
  sb_state "$SB_D"
  [ "$sb_st" != running ] && break
  o=$(sb_size "$SB_D/o"); e=$(sb_size "$SB_D/e")
  [ "$o" -gt "$l" ] && o=$l
  [ "$e" -gt "$l" ] && e=$l
  [ "$o" -ne "$SB_OF" ] || [ "$e" -ne "$SB_EF" ] && break
  [ "$(sb_now)" -ge "$dl" ] && break
  sleep 0.05
done
sb_line "$SB_D" "$SB_ID"
piece() {
  v=$2; [ "$v" -gt "$sb_l" ] && v=$sb_l
  n=$((v - $3)); [ "$n" -gt "$SB_MAX" ] && n=$SB_MAX
  [ "$n" -gt 0 ] && tail -c +"$(($3 + 1))" -- "$SB_D/$1" | head -c "$n" | base64 -w 0
  printf '\n'
}
piece o "$sb_o" "$SB_OF"
piece e "$sb_e" "$SB_EF"
printf 'sessionbox-aio:end\n'"#
);

/// Kills a running background command: writes `killed`, sends `SIGKILL` to its process group
/// (the runner, in a group of its own, lives on to record the end) and waits up to
/// `SB_KILL_WAIT_MS` for the end record; a command that has ended is left as it is. Prints its
/// status line as [`STATUS`] does. Env: `SB_D`, `SB_ID`, `SB_KILL_WAIT_MS`.
pub(crate) const KILL: &str = concat!(
    common!(),
    r#"[ -f "$SB_D/started" ] || { printf 'sessionbox-aio:gone\n'; exit 0; }
sb_state "$SB_D"
if [ "$sb_st" = running ]; then
  : > "$SB_D/killed"
  i=0
  while [ ! -f "$SB_D/pid" ] && [ "$i" -lt 200 ]; do sleep 0.01; i=$((i + 1)); done
  if read -r p < "$SB_D/pid" 2>/dev/null; then
    kill -s KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
  fi
  dl=$(( $(sb_now) + SB_KILL_WAIT_MS ))
  while :; do
    sb_state "$SB_D"
    [ "$sb_st" = running ] || break
    [ "$(sb_now)" -ge "$dl" ] && break
    sleep 0.02
  done
fi
sb_line "$SB_D" "$SB_ID""#
);
