#!/usr/bin/env python
"""Django's command line for the example (``python manage.py migrate | runserver | test | unilog_consume``)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rides_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
