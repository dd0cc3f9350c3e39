from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = [("unilog", "0001_unilog_schema")]
    operations = [
        migrations.CreateModel(
            name="Ride",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("distance", models.DecimalField(decimal_places=3, max_digits=14)),
            ],
        ),
        migrations.CreateModel(
            name="Total",
            fields=[
                ("consumer", models.TextField(primary_key=True, serialize=False)),
                ("distance", models.DecimalField(decimal_places=3, default=0, max_digits=20)),
                ("rides", models.BigIntegerField(default=0)),
            ],
        ),
    ]
