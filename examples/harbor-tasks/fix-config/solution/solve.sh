#!/bin/bash
set -e
cd /app
# only inside their sections: [cache] has a port too
sed -i '/^\[server\]/,/^\[/ s/^port = 80$/port = 8080/; /^\[logging\]/,/^\[/ s/^level = verbose$/level = debug/' service.ini
