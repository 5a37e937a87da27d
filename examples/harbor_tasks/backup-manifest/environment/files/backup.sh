#!/bin/bash
. /usr/share/backup/lib.sh
list_sizes ./file > manifest.txt
