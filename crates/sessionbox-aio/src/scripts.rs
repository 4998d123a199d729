//! The fixed shell scripts the runtime runs inside the container through `/v1/bash/exec`.
//!
//! Every value reaches a script through the request's `env` (never spliced into the command
//! text), so no path or command needs quoting. Scripts answer on stdout with one line:
//! `ok<TAB>fields...` or `err<TAB>code<TAB>detail`.

/// Creates the conversations root and the workspace (mode 0700), refusing a workspace that is a
/// symbolic link. Env: `SB_ROOT`, `SB_WS`.
pub const OPEN: &str = r#"set -u
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
pub const EXEC: &str = r#"sb_w=$(realpath -e -- "$SB_WS" 2>/dev/null) || { printf 'sessionbox-aio:no-workspace\n' >&2; exit 125; }
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
pub const COLLECT: &str = r#"[ -d "$SB_OUT" ] || { printf 'sessionbox-aio:gone\n'; exit 0; }
printf 'sessionbox-aio:1 -\n'
[ -s "$SB_OUT/o" ] && head -c "$SB_LIMIT" -- "$SB_OUT/o" | base64 -w 0
printf '\n'
[ -s "$SB_OUT/e" ] && head -c "$SB_LIMIT" -- "$SB_OUT/e" | base64 -w 0
printf '\nsessionbox-aio:end\n'
rm -rf -- "$SB_OUT""#;

/// Directory, beside the workspaces under the conversations root, holding the per-command
/// output directories of [`EXEC`] (named `<key>.<unique>`, removed when the command ends).
pub const EXEC_OUTPUT_DIR: &str = ".sessionbox-exec";

/// Exit code [`EXEC`] uses when it refuses.
pub const EXEC_REFUSED: i32 = 125;

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
pub const FILE_OP: &str = r#"set -u
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
    else rmdir -- "$t" 2>/dev/null || fail not_empty "the directory is not empty; remove it recursively"; fi
  else
    rm -f -- "$t" 2>/dev/null || fail io "cannot remove the file"
  fi
  printf 'ok\n' ;;
*) fail invalid "unknown operation" ;;
esac"#;

/// Kills every process whose working directory is inside `SB_WS` (then removes the workspace,
/// and any output directories its commands left in [`EXEC_OUTPUT_DIR`], when `SB_REMOVE=1`). Prints `ok KILLED REMOVED`. `SB_WS` is always `<root>/<64 hex digits>`.
pub const DESTROY: &str = r#"set -u
W=$(realpath -m -- "$SB_WS")
killed=0
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
  rm -rf -- "$SB_WS" 2>/dev/null && removed=1
  rm -rf -- "${SB_WS%/*}/.sessionbox-exec/${SB_WS##*/}".* 2>/dev/null
  [ -e "$SB_WS" ] && { printf 'err\tio\tcannot remove the workspace\n'; exit 0; }
fi
printf 'ok\t%s\t%s\n' "$killed" "$removed""#;

/// Lists the workspaces under `SB_ROOT` (`D NAME`) and the processes whose working directory
/// is inside one (`P PID NAME`).
pub const INVENTORY: &str = r#"set -u
[ -d "$SB_ROOT" ] || exit 0
R=$(realpath -e -- "$SB_ROOT") || exit 0
for d in "$R"/*; do [ -d "$d" ] && printf 'D\t%s\n' "${d##*/}"; done
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [ "$pid" = "$$" ] && continue
  c=$(readlink "$d/cwd" 2>/dev/null) || continue
  case "$c/" in "$R"/*) k=${c#"$R"/}; printf 'P\t%s\t%s\n' "$pid" "${k%%/*}" ;; esac
done"#;
