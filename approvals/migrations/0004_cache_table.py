# The database cache table (settings.CACHES when no CACHE_URL is set), so every web process sees
# the same login-lockout counters without a separate `createcachetable` step.
from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0003_kb_degrade_rule")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
