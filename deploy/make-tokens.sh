#!/usr/bin/env bash
# make-tokens.sh DIR: the tokens of a strata cluster that authenticates its
# callers, made with openssl into DIR:
#   auth             the coordinator's --auth_file: an operator "admin" and
#                    a user "trainer"
#   operator.token   the operator's token (stratactl --token_file)
#   user.token       the user's token (trainers: --token_file, strata.launch
#                    --token-file; stratactl on the user's jobs)
# Does nothing when DIR/auth exists (delete it to make new tokens; add users
# by appending "user NAME TOKEN" lines to it and restarting the coordinator).
# With STRATA_CERT_OWNER=UID the auth file is made readable by that user only
# (the image's daemons run as uid 10001); the token files belong to DIR's
# owner, readable by it only.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
if [ -e "$dir/auth" ]; then
  echo "make-tokens: $dir/auth exists; keeping the tokens there"
  exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

operator=$(openssl rand -hex 32)
user=$(openssl rand -hex 32)
printf '%s\n' "$operator" >"$work/operator.token"
printf '%s\n' "$user" >"$work/user.token"
printf '%s\n' "# strata-coordinator --auth_file: ROLE NAME TOKEN" \
  "operator admin $operator" "user trainer $user" >"$work/auth"

people=(-o "$(stat -c %u "$dir")" -g "$(stat -c %g "$dir")")
install -m 0600 "${people[@]}" "$work/operator.token" "$work/user.token" "$dir/"
daemons=()
[ -n "${STRATA_CERT_OWNER:-}" ] && daemons=(-o "$STRATA_CERT_OWNER")
install -m 0600 "${daemons[@]}" "$work/auth" "$dir/"
echo "make-tokens: an operator's and a user's token in $dir (operator.token, user.token)"
