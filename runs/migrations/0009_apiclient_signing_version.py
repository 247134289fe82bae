from django.db import migrations, models


class Migration(migrations.Migration):
    """Signing secrets derived with salted_hmac (version 2). Clients that exist already keep the
    derivation their secret was issued under (version 1) until their credentials are rotated."""

    dependencies = [
        ("runs", "0008_decisions_name_what_was_shown"),
    ]

    operations = [
        migrations.AddField(
            model_name="apiclient",
            name="signing_version",
            field=models.PositiveSmallIntegerField(default=1, editable=False),
        ),
        migrations.AlterField(
            model_name="apiclient",
            name="signing_version",
            field=models.PositiveSmallIntegerField(default=2, editable=False),
        ),
    ]
