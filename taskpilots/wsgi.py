import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

from taskpilots import dbpool

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskpilots.settings")
# The web process's connections run without JIT (taskpilots/dbpool.py); set before any opens.
dbpool.apply_web_options(settings.DATABASES["default"]["OPTIONS"])
application = get_wsgi_application()
