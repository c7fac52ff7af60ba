#!/bin/bash
set -e
cat > /app/bin/greet <<'SH'
#!/bin/sh
[ "$#" -eq 0 ] && set -- world
for name in "$@"; do printf 'Hello, %s!\n' "$name"; done
SH
chmod +x /app/bin/greet
