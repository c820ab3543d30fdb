#!/bin/sh
# Packages must not start their services on install: taskserv scripts start them, with the
# configuration they render (the convention of Docker's Debian images).
exit 101
